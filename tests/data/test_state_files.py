"""The staging cache's state files read as untrusted input, and every wait on them with a deadline.

Each test runs the code under test in a thread with a short join: before the fix several of these blocked forever
(a FIFO, a link to /dev/zero, a state that says "ready" for a file that is gone), so "it returned in time" is part of
what is asserted.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads import safeio
from workloads.data.format.manifest import HEARTBEAT, PLAN_STATE, STAGER_STATE
from workloads.data.moving.cache import (
    CacheReader,
    CacheStagerError,
    ReadPlan,
    StagerState,
    cache_dir,
    read_plan,
    read_stager_state,
    touch_heartbeat,
    write_plan,
    write_stager_state,
)
from workloads.safeio import StateFileError

SHARD = "shard-00000.h5"


def within(seconds: float, action: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """(result, exception) of `action`, which must finish within `seconds` (else the test fails, not hangs)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = action()
        except BaseException as exc:  # reported to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds}s"
    return box.get("result"), box.get("error")


def state_path(dest: Path) -> Path:
    return cache_dir(dest) / STAGER_STATE


def write_raw(dest: Path, name: str, payload: bytes) -> Path:
    cache_dir(dest).mkdir(parents=True, exist_ok=True)
    path = cache_dir(dest) / name
    path.write_bytes(payload)
    return path


# -- the reader's waits -----------------------------------------------------------------------------------------------
def test_a_shard_listed_ready_but_missing_fails_at_once(tmp_path: Path) -> None:
    write_stager_state(tmp_path, StagerState(budget=1 << 20, ready=[SHARD]))
    touch_heartbeat(tmp_path)
    _, error = within(2, lambda: CacheReader(tmp_path).wait_ready(SHARD, timeout=30))
    assert isinstance(error, CacheStagerError) and SHARD in str(error) and "missing" in str(error), error


def test_a_shard_listed_ready_that_is_a_link_fails_at_once(tmp_path: Path) -> None:
    (tmp_path / SHARD).symlink_to("/dev/zero")
    write_stager_state(tmp_path, StagerState(budget=1 << 20, ready=[SHARD]))
    _, error = within(2, lambda: CacheReader(tmp_path).wait_ready(SHARD, timeout=30))
    assert isinstance(error, CacheStagerError) and "not a regular file" in str(error), error


def test_a_finished_stager_without_the_shard_fails_at_once(tmp_path: Path) -> None:
    write_stager_state(tmp_path, StagerState(budget=None, ready=[], done=True))
    touch_heartbeat(tmp_path)
    _, error = within(2, lambda: CacheReader(tmp_path).wait_ready(SHARD, timeout=30))
    assert isinstance(error, CacheStagerError) and "done" in str(error) and SHARD in str(error), error


def test_no_heartbeat_means_no_stager_and_fails_within_the_stager_timeout(tmp_path: Path) -> None:
    """A stager killed (OOM) before it could publish its error: the reader stops waiting when the heartbeat ends."""
    write_stager_state(tmp_path, StagerState(budget=1 << 20, ready=[]))
    touch_heartbeat(tmp_path)
    old = time.time() - 120
    os.utime(cache_dir(tmp_path) / HEARTBEAT, (old, old))
    reader = CacheReader(tmp_path, heartbeat_timeout_s=0.2)
    _, error = within(20, lambda: reader.wait_ready(SHARD, timeout=30))
    assert isinstance(error, CacheStagerError) and "no stager is running" in str(error) and HEARTBEAT in str(error)
    (cache_dir(tmp_path) / HEARTBEAT).unlink()  # never any heartbeat: counted from the start of the wait
    started = time.monotonic()
    _, error = within(20, lambda: reader.wait_ready(SHARD, timeout=30))
    # the heartbeat's 0.2 s, counted from the start of the wait (a lower bound: no load makes it shorter); the
    # shard's 30 s would be a TimeoutError, not CacheStagerError
    assert isinstance(error, CacheStagerError) and "no stager is running" in str(error), repr(error)
    assert time.monotonic() - started >= 0.2


def test_a_live_stager_is_waited_for_until_the_deadline_saying_what_for(tmp_path: Path) -> None:
    write_stager_state(tmp_path, StagerState(budget=1 << 20, ready=[]))
    notices: list[str] = []
    reader = CacheReader(tmp_path, heartbeat_timeout_s=60, notify=notices.append, notice_after_s=0.05)
    touch_heartbeat(tmp_path)
    _, error = within(3, lambda: reader.wait_ready(SHARD, timeout=0.3))
    assert isinstance(error, TimeoutError) and str(error).startswith(f"{tmp_path / SHARD}: not staged after 0.3s")
    assert notices and all(str(tmp_path / SHARD) in line and "waiting for the stager" in line for line in notices)


@pytest.mark.parametrize("payload", [b'{"done": "no"}', b'{"done": 0}', b'{"budget": true}', b'{"budget": "1"}',
                                     b'{"ready": "shard-00000.h5"}', b'{"ready": [1]}', b'{"error": 5}', b"[]",
                                     b'"x"', b"\xff\xfe", b"{", b"[" * 100_000])
def test_a_stager_state_of_the_wrong_type_is_a_one_line_error(payload: bytes, tmp_path: Path) -> None:
    """`"done": "no"` used to read as true (bool("no")); every field's JSON type is checked."""
    write_raw(tmp_path, STAGER_STATE, payload)
    _, error = within(2, lambda: read_stager_state(tmp_path))
    assert isinstance(error, StateFileError) and str(error).startswith(f"{state_path(tmp_path)}: "), error
    assert "\n" not in str(error)


@pytest.mark.parametrize("payload", [b'{"done": "false"}', b'{"order": {"a": 1}}', b'{"order": [null]}'])
def test_a_plan_of_the_wrong_type_is_a_one_line_error(payload: bytes, tmp_path: Path) -> None:
    write_raw(tmp_path, PLAN_STATE, payload)
    with pytest.raises(StateFileError, match=f"^{cache_dir(tmp_path) / PLAN_STATE}: "):
        read_plan(tmp_path)


def test_a_stager_state_that_is_a_fifo_never_blocks(tmp_path: Path) -> None:
    cache_dir(tmp_path).mkdir()
    os.mkfifo(state_path(tmp_path))
    _, error = within(2, lambda: read_stager_state(tmp_path))
    assert isinstance(error, StateFileError) and "FIFO" in str(error)
    _, error = within(2, lambda: CacheReader(tmp_path).wait_ready(SHARD, timeout=30))
    assert isinstance(error, StateFileError) and "FIFO" in str(error)


def test_a_stager_state_that_links_to_dev_zero_is_not_followed(tmp_path: Path) -> None:
    cache_dir(tmp_path).mkdir()
    state_path(tmp_path).symlink_to("/dev/zero")
    _, error = within(2, lambda: read_stager_state(tmp_path))
    assert isinstance(error, StateFileError) and "symbolic link" in str(error), error


def test_a_huge_state_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    cache_dir(tmp_path).mkdir()
    with open(state_path(tmp_path), "wb") as handle:
        handle.truncate(safeio.STATE_MAX_BYTES + 1)  # sparse: costs nothing to make, a lot to read
    _, error = within(2, lambda: read_stager_state(tmp_path))
    assert isinstance(error, StateFileError) and "larger than" in str(error)


def test_a_cache_dir_that_is_a_link_is_neither_read_nor_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / STAGER_STATE).write_text(json.dumps({"ready": [SHARD]}))
    dest = tmp_path / "dest"
    dest.mkdir()
    cache_dir(dest).symlink_to(elsewhere)
    with pytest.raises(StateFileError, match="not a directory"):
        read_stager_state(dest)
    with pytest.raises(StateFileError, match="not a directory"):
        write_plan(dest, ReadPlan(order=[SHARD]))
    with pytest.raises(StateFileError, match="not a directory"):
        write_stager_state(dest, StagerState())
    assert sorted(p.name for p in elsewhere.iterdir()) == [STAGER_STATE]


def test_an_unchanged_state_is_not_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader polls every 10 ms: an unchanged file costs a stat, not a parse (a large plan used to cost a core)."""
    parses: list[int] = []
    original = safeio.parse_json_object

    def counting(payload: bytes, where: Any) -> dict[str, Any]:
        parses.append(len(payload))
        return original(payload, where)

    monkeypatch.setattr(safeio, "parse_json_object", counting)
    write_plan(tmp_path, ReadPlan(order=[f"shard-{i:05d}.h5" for i in range(20_000)]))
    from workloads.data.moving.cache import plan_file

    source = plan_file(tmp_path)
    first = source.read()
    for _ in range(200):
        assert source.read() is first
    assert len(parses) == 1
    write_plan(tmp_path, ReadPlan(order=[SHARD], done=True))
    assert source.read() == ReadPlan(order=[SHARD], done=True) and len(parses) == 2


# -- property: whatever is in .cache, a clean answer within the deadline ---------------------------------------------
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=4), max_leaves=12)
_FIELDS = st.fixed_dictionaries({}, optional={"budget": _JSON, "ready": _JSON | st.lists(st.sampled_from(
    [SHARD, "shard-00001.h5"]), max_size=3), "done": _JSON, "error": _JSON, "order": _JSON})
_CONTENT = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=64)),
    st.tuples(st.just("json"), _JSON.map(lambda value: json.dumps(value).encode())),
    st.tuples(st.just("json"), _FIELDS.map(lambda value: json.dumps(value).encode())),
    st.tuples(st.just("huge"), st.just(b"")),
    st.tuples(st.just("fifo"), st.just(b"")),
    st.tuples(st.just("dir"), st.just(b"")),
    st.tuples(st.sampled_from(["link-zero", "link-dangling", "link-file"]), st.just(b"")),
)


def _make(path: Path, kind: str, payload: bytes) -> None:
    if kind in ("bytes", "json"):
        path.write_bytes(payload)
    elif kind == "huge":
        with open(path, "wb") as handle:
            handle.truncate(safeio.STATE_MAX_BYTES + 4096)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "link-zero":
        path.symlink_to("/dev/zero")
    elif kind == "link-dangling":
        path.symlink_to(path.parent / "nowhere")
    else:
        target = path.parent / "real.json"
        target.write_text('{"ready": [], "order": []}')
        path.symlink_to(target)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=_CONTENT, plan=_CONTENT, listed=st.booleans())
def test_any_cache_state_gives_a_clean_answer_in_time(tmp_path_factory: pytest.TempPathFactory,
                                                       state: tuple[str, bytes], plan: tuple[str, bytes],
                                                       listed: bool) -> None:
    dest = tmp_path_factory.mktemp("dest")
    cache_dir(dest).mkdir()
    _make(state_path(dest), *state)
    _make(cache_dir(dest) / PLAN_STATE, *plan)
    if listed:
        (dest / SHARD).write_bytes(b"shard")
    touch_heartbeat(dest)

    for read in (read_stager_state, read_plan):
        result, error = within(2, lambda read=read: read(dest))  # type: ignore[misc]
        if error is not None:
            assert isinstance(error, StateFileError) and "\n" not in str(error), repr(error)
            assert str(error).startswith(str(cache_dir(dest))), error
        elif result is not None:
            assert isinstance(result, StagerState | ReadPlan)
            if isinstance(result, StagerState):
                assert isinstance(result.done, bool) and all(isinstance(name, str) for name in result.ready)
                assert result.budget is None or (type(result.budget) is int and result.budget > 0)
            else:
                assert isinstance(result.done, bool) and all(isinstance(name, str) for name in result.order)

    reader = CacheReader(dest, poll_interval_s=0.005, heartbeat_timeout_s=60)
    result, error = within(20, lambda: reader.wait_ready(SHARD, timeout=0.05))  # a 0.05 s deadline, never a hang
    if error is None:
        assert result == dest / SHARD and listed  # only a shard that is really there is ever "ready"
    else:
        assert isinstance(error, TimeoutError | CacheStagerError | StateFileError), repr(error)
        assert "\n" not in str(error)


# -- the stager's side ------------------------------------------------------------------------------------------------
@pytest.fixture
def source(packed: Path, s3_url: str, bucket: str) -> tuple[Any, Any, int]:
    from tests.data.helpers import uploaded
    from workloads.data.format.manifest import load_manifest
    from workloads.data.moving.s3 import make_client

    return make_client(s3_url, 8), uploaded(packed, s3_url, bucket), sum(s.bytes for s in load_manifest(packed).shards)


def _stage(source: tuple[Any, Any, int], dest: Path, **options: Any) -> Callable[[], Any]:
    from tests.data.helpers import stage_options
    from workloads.data.moving.stage import stage

    client, uri, _ = source
    return lambda: stage(client, uri, dest, stage_options(**options))


def test_wait_timeout_gives_up_on_a_reader_that_never_comes_when_everything_fits(
        source: tuple[Any, Any, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The budget holds the dataset: everything is fetched, then the stager waited forever for a plan."""
    from workloads.data.format.errors import DataToolError

    dest = tmp_path / "dest"
    _, error = within(15, _stage(source, dest, budget_bytes=source[2], wait_timeout_s=0.3, first_plan_wait_s=0.05))
    assert isinstance(error, DataToolError) and error.runtime, repr(error)
    assert error.where == str(cache_dir(dest) / PLAN_STATE) and "--wait-timeout" in error.why
    assert "waiting for a plan" in capsys.readouterr().err  # it said what it waited for
    state = read_stager_state(dest)
    assert state is not None and state.error is not None and "--wait-timeout" in state.error


def test_a_plan_that_is_a_fifo_does_not_block_the_stager(source: tuple[Any, Any, int], tmp_path: Path) -> None:
    from workloads.data.format.errors import DataToolError

    dest = tmp_path / "dest"
    cache_dir(dest).mkdir(parents=True)
    os.mkfifo(cache_dir(dest) / PLAN_STATE)
    _, error = within(10, _stage(source, dest, budget_bytes=source[2], wait_timeout_s=0.5))
    assert isinstance(error, DataToolError) and not error.runtime, repr(error)
    assert error.where == str(cache_dir(dest) / PLAN_STATE) and "FIFO" in error.why


def test_a_cache_dir_that_is_a_link_never_lets_the_stager_write_outside_dest(source: tuple[Any, Any, int],
                                                                             tmp_path: Path) -> None:
    from workloads.data.format.errors import DataToolError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    cache_dir(dest).symlink_to(elsewhere)
    for options in ({"budget_bytes": source[2]}, {}):  # serving, and a copy (which removes a stale stager.json)
        (elsewhere / STAGER_STATE).write_text("{}")
        _, error = within(10, _stage(source, dest, **options))
        assert isinstance(error, DataToolError) and "not a directory" in error.why, repr(error)
        assert sorted(p.name for p in elsewhere.iterdir()) == [STAGER_STATE]
        assert (elsewhere / STAGER_STATE).read_text() == "{}"


def test_a_serving_stager_keeps_a_heartbeat(source: tuple[Any, Any, int], tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    write_plan(dest, ReadPlan(order=[], done=True))
    result, error = within(15, _stage(source, dest, budget_bytes=source[2], heartbeat_interval_s=0.05))
    assert error is None, error
    assert (cache_dir(dest) / HEARTBEAT).is_file()
