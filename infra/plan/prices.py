"""Where unit prices come from: the AWS Price List API, Spot price history and Capacity Block offerings, or the
committed offline fixture.

Both sources answer the same `infra.plan.pricing.PriceQuery`s with a response in the real AWS shape
(pricing.get_products, ec2.describe_spot_price_history, ec2.describe_capacity_block_offerings), read by the same
parsers, so the offline plan and a real run differ only in where the response came from. The fixture
(stacks/fixtures/prices.json) holds request/response pairs; a query it has no pair for is an error naming the
request, never a guessed price.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.plan.holdings import price_queries
from infra.plan.pricing import (
    PriceError,
    PriceQuery,
    capacity_block_request,
    get_products_request,
    parse_capacity_block_offerings,
    parse_get_products,
    parse_spot_history,
    spot_history_request,
)

FIXTURE = Path(__file__).resolve().parents[2] / "stacks" / "fixtures" / "prices.json"
# The Price List API is served from a few regions only; its prices cover every region.
PRICING_REGION = "us-east-1"

FIXTURE_SOURCE = "offline prices (stacks/fixtures/prices.json; Spot from its price history)"
AWS_SOURCE = ("AWS prices (pricing.get_products, on-demand list prices; Spot from ec2.describe_spot_price_history, "
              "newest price per zone, highest zone; Capacity Blocks from ec2.describe_capacity_block_offerings, the "
              "cheapest offer)")


def _where(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(FIXTURE.parent.parent.parent))
    except ValueError:
        return str(path)


def fixture_prices(queries: Sequence[PriceQuery], path: Path = FIXTURE) -> dict[str, float]:
    """Answer `queries` from the responses in `path`. Raises PriceError naming the file."""
    where = _where(path)
    try:
        document = json.loads(path.read_text())
        products = document["getProducts"]
        spots = document["describeSpotPriceHistory"]
        blocks = document.get("describeCapacityBlockOfferings", [])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PriceError(where, f"unreadable price fixture: {getattr(exc, 'strerror', None) or exc}") from None
    prices: dict[str, float] = {}
    for query in queries:
        if query.kind == "spot":
            request = spot_history_request(query)
            pair = next((p for p in spots if p.get("region") == query.region and p.get("request") == request), None)
        elif query.kind == "capacity-block":
            request = capacity_block_request(query)
            pair = next((p for p in blocks if p.get("region") == query.region and p.get("request") == request), None)
        else:
            request = get_products_request(query)
            pair = next((p for p in products if p.get("request") == request), None)
        if pair is None:
            # One short line: the price that is missing and the two ways to get it (the request itself, which the
            # fixture entry must repeat, is in the fixture's other entries of the same kind).
            raise PriceError(where, f"no fixture response for {query.key}: add one like the others in the file "
                                    "to price this offline, or ask AWS: make cost PRICES=aws (credentials needed)")
        parse = {"spot": parse_spot_history, "capacity-block": parse_capacity_block_offerings}.get(
            query.kind, parse_get_products)
        try:
            prices[query.key] = parse(pair["response"], query)
        except PriceError as exc:
            raise PriceError(where, exc.why) from None
    return prices


ClientFactory = Callable[[str, str], Any]  # (service, region) -> boto3 client


def aws_prices(queries: Sequence[PriceQuery], client: ClientFactory,
               now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> dict[str, float]:
    """Answer `queries` from AWS: get_products (paginated) for list prices, describe_spot_price_history at
    StartTime=now (the current price in each zone) for Spot. Raises PriceError; botocore errors propagate."""
    prices: dict[str, float] = {}
    pricing = None
    for query in queries:
        if query.kind == "spot":
            ec2 = client("ec2", query.region)
            history: list[dict[str, Any]] = []
            paginator = ec2.get_paginator("describe_spot_price_history")
            for page in paginator.paginate(**spot_history_request(query), StartTime=now()):
                history.extend(page.get("SpotPriceHistory") or [])
            prices[query.key] = parse_spot_history({"SpotPriceHistory": history}, query)
        elif query.kind == "capacity-block":
            offers: list[dict[str, Any]] = []
            paginator = client("ec2", query.region).get_paginator("describe_capacity_block_offerings")
            for page in paginator.paginate(**capacity_block_request(query)):
                offers.extend(page.get("CapacityBlockOfferings") or [])
            prices[query.key] = parse_capacity_block_offerings({"CapacityBlockOfferings": offers}, query)
        else:
            pricing = pricing or client("pricing", PRICING_REGION)
            items: list[Any] = []
            for page in pricing.get_paginator("get_products").paginate(**get_products_request(query)):
                items.extend(page.get("PriceList") or [])
            prices[query.key] = parse_get_products({"FormatVersion": "aws_v1", "PriceList": items}, query)
    return prices


def prices_for(plans: Sequence[Mapping[str, Any]], client: ClientFactory | None) -> tuple[dict[str, float], str]:
    """Every price the plans need, once, and the source's label: from AWS when `client` is given, otherwise from
    the fixture. Raises PriceError (AWS errors become PriceError("aws", why), one line)."""
    unique = list({query.key: query for plan in plans for query in price_queries(plan)}.values())
    if client is None:
        return fixture_prices(unique), FIXTURE_SOURCE
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return aws_prices(unique, client), AWS_SOURCE
    except (BotoCoreError, ClientError) as exc:
        raise PriceError("aws", str(exc).replace("\n", " ")) from None
