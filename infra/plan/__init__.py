"""The offline plan and what reads it: the engine that runs the real program under the Pulumi SDK mock engine
(engine.py), the views and --diff of its document (view.py), and the cost estimate with its prices (cost.py,
prices.py)."""
