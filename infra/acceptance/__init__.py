"""The first-deploy acceptance kit: what an evaluator asks of a real account and cluster, run in order, each step
with a deadline, every step's log and one summary written into an evidence bundle.

plan.py (the steps of a stack and their commands: pure) -> runner.py (order, deadlines, failure stops the run,
destroy always after up) -> bundle.py (the summary's model, its JSON Schema, the atomic write and the check of a
bundle); probes.py holds the steps that are not one of the project's CLIs (burn-in labels, the chaos step, what a
destroy left behind), each over the kubernetes client or boto3 with a deadline.
"""
