"""Scripted runbooks: ordered kcli operations in a YAML file, validated, resumable (issue 7).

Pipeline: :mod:`loader` (safe YAML with positions) → :mod:`validate` (every problem, with
line and column) → :mod:`model` (the checked runbook) → :mod:`runner` (executes with
:mod:`operations`, records progress in :mod:`state`) → :mod:`report` (lines or JSON).
"""
