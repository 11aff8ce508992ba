"""ELFES benchmarks: what the engine costs against hand-written code, and what a preemption costs.

Run them all with ``python -m benchmarks`` (see ``benchmarks/__main__.py``); each module measures one
thing and returns rows of the results table.
"""
