"""Check a loaded runbook and build the model, collecting EVERY problem with its position.

The validator never stops at the first mistake: an operator fixing a runbook wants the whole
list (``FILE:LINE:COL: message``) in one go. Variables are substituted here, before types are
checked, so ``partitions: ${count}`` is validated as the integer it will be.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from kcli.errors import UsageError
from kcli.runbook import operations
from kcli.runbook.loader import Document, PathKey, Problem
from kcli.runbook.model import (
    COMPARATORS,
    ON_ERROR,
    Condition,
    Runbook,
    Step,
    WaitFor,
    format_duration,
    parse_duration,
    split_path,
)

TOP_KEYS = ("description", "context", "bootstrap_server", "variables", "steps")
STEP_KEYS = ("name", "wait_for", "expect", "on_error")
WAIT_KEYS = ("describe", "path", "timeout", "interval")
DEFAULT_WAIT_TIMEOUT_S = 60.0
DEFAULT_WAIT_INTERVAL_S = 0.5

_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}")


def _did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Validator:
    def __init__(self, doc: Document, cli_vars: dict[str, str]) -> None:
        self.doc = doc
        self.cli_vars = cli_vars
        self.problems: list[Problem] = list(doc.problems)
        self.variables: dict[str, Any] = {}
        self.unresolved = 0  # uses of a variable with no value (reported once, at its declaration)

    # --- helpers ---------------------------------------------------------------------------

    def add(self, path: PathKey, message: str, key: bool = False) -> None:
        if any(path[:i] in self.doc.refused for i in range(len(path) + 1)):
            return  # already reported by the loader (refused tag)
        self.problems.append(self.doc.problem(path, message, key))

    def subst(self, value: Any, path: PathKey) -> Any:
        """``${name}`` → the variable's value (typed when it is the whole string); ``$${`` → ``${``."""
        if isinstance(value, dict):
            return {k: self.subst(v, path + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.subst(v, path + (i,)) for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        whole = re.fullmatch(r"\$\{([^}]*)\}", value)
        if whole and whole.group(1) in self.variables and self.variables[whole.group(1)] is not None:
            return self.variables[whole.group(1)]

        def replace(m: re.Match[str]) -> str:
            if m.group(0) == "$${":
                return "${"
            name = m.group(1)
            if name not in self.variables:
                declared = ", ".join(sorted(self.variables)) or "none declared"
                self.add(path, f"unknown variable {name!r} in {value!r} (variables: {declared})")
                return m.group(0)
            val = self.variables[name]
            if val is None:
                self.unresolved += 1
                return m.group(0)  # reported once, where it is declared
            return ("true" if val else "false") if isinstance(val, bool) else str(val)

        return _VAR_REF.sub(replace, value)

    def mark(self) -> tuple[int, int]:
        """Compare before/after a substitution: did it report or leave something unresolved?"""
        return len(self.problems), self.unresolved

    def text(self, data: dict[str, Any], key: str, path: PathKey) -> str | None:
        """The string at ``key`` with variables substituted; None when absent or unresolved."""
        if key not in data or data[key] is None:
            return None
        before = self.mark()
        value = self.subst(data[key], path + (key,))
        if self.mark() != before:
            return None
        if isinstance(value, (dict, list)):
            self.add(path + (key,), f"{key} must be a string")
            return None
        return str(value)

    # --- top level -------------------------------------------------------------------------

    def run(self) -> Runbook | None:
        data = self.doc.data
        if not isinstance(data, dict):
            self.add((), "a runbook is a mapping with steps (and optionally context, bootstrap_server, variables)")
            return None
        for key in data:
            if key not in TOP_KEYS:
                self.add((key,), f"unknown top-level key {key!r}{_did_you_mean(key, TOP_KEYS)} "
                                 f"(allowed: {', '.join(TOP_KEYS)})", key=True)
        self.read_variables(data.get("variables"))
        description = self.text(data, "description", ())
        context = self.text(data, "context", ())
        bootstrap = self.text(data, "bootstrap_server", ())
        if context is not None and bootstrap is not None:
            self.add(("bootstrap_server",), "give context or bootstrap_server, not both", key=True)
        if bootstrap is not None:
            from kcli.contexts import validate_bootstrap

            try:
                bootstrap = validate_bootstrap(bootstrap, "bootstrap_server")
            except UsageError as err:
                self.add(("bootstrap_server",), str(err))
        if context is not None:
            from kcli import contexts as contexts_file

            try:
                contexts_file.load().get(context)
            except UsageError as err:
                self.add(("context",), str(err))
        steps = self.read_steps(data.get("steps"), "steps" in data)
        if self.problems:
            return None
        return Runbook(path=Path(self.doc.file), file=self.doc.file, description=description, context=context,
                       bootstrap_server=bootstrap, variables=dict(self.variables), steps=steps)

    def read_variables(self, raw: Any) -> None:
        declared: dict[str, Any] = {}
        if raw is not None:
            if not isinstance(raw, dict):
                self.add(("variables",), "variables must be a mapping of NAME: value")
            else:
                for name, value in raw.items():
                    path = ("variables", name)
                    if not _VAR_NAME.match(name):
                        self.add(path, f"invalid variable name {name!r}: use letters, digits and _", key=True)
                    elif isinstance(value, (dict, list)):
                        self.add(path, f"variable {name!r} must be a string, number, boolean or null (required)")
                    else:
                        declared[name] = value
        for name, value in self.cli_vars.items():
            if name not in declared:
                at = ("variables",) if raw is not None else ()
                known = ", ".join(sorted(declared)) or "none declared"
                self.add(at, f"--var {name}: the runbook declares no variable {name!r} (variables: {known})",
                         key=bool(at))
            else:
                declared[name] = value  # --var wins
        for name, value in declared.items():
            if value is None:
                self.add(("variables", name), f"variable {name!r} has no value: pass --var {name}=VALUE", key=True)
        self.variables = declared

    # --- steps -----------------------------------------------------------------------------

    def read_steps(self, raw: Any, present: bool) -> list[Step]:
        if not present:
            self.add((), "the runbook has no steps: add `steps:` with a list of operations")
            return []
        if not isinstance(raw, list) or not raw:
            self.add(("steps",), "steps must be a non-empty list of operations")
            return []
        steps = []
        for i, item in enumerate(raw):
            step = self.read_step(i, item)
            if step is not None:
                steps.append(step)
        return steps

    def read_step(self, i: int, raw: Any) -> Step | None:
        path: PathKey = ("steps", i)
        if not isinstance(raw, dict):
            self.add(path, f"step {i + 1}: expected a mapping such as `topics.describe: {{topic: orders}}`")
            return None
        op_keys = [k for k in raw if k not in STEP_KEYS]
        known = [k for k in op_keys if operations.get(k) is not None]
        for k in op_keys:
            if operations.get(k) is None:
                hint = _did_you_mean(k, list(operations.REGISTRY) + list(STEP_KEYS))
                self.add(path + (k,), f"unknown operation {k!r}{hint}", key=True)
        if len(known) > 1:
            self.add(path + (known[1],), f"a step runs one operation; this one has {' and '.join(known)}", key=True)
        if not op_keys:
            self.add(path, f"step {i + 1} names no operation (one of: {', '.join(operations.REGISTRY)})")
        # the rest of the step is checked even when its operation is not, to report everything
        wait_for = self.read_wait_for(raw["wait_for"], path + ("wait_for",)) if "wait_for" in raw else None
        expect = self.read_expect(raw.get("expect"), path + ("expect",))
        on_error = self.text(raw, "on_error", path) or "stop"
        if on_error not in ON_ERROR:
            self.add(path + ("on_error",), f"on_error must be stop or continue, got {on_error!r}")
        title = self.text(raw, "name", path)
        if len(known) != 1:
            return None
        name = known[0]
        op = operations.get(name)
        assert op is not None
        args = self.read_args(op, raw[name], path + (name,))
        if args is None:
            return None
        if not title:
            subject = args.get(op.title_field) if op.title_field else None
            if isinstance(subject, float) and op.fields[op.title_field or ""].type == "duration":
                subject = format_duration(subject)
            title = f"{name} {subject}" if subject is not None else name
        return Step(index=i + 1, name=title, op=name, args=args, wait_for=wait_for, expect=expect,
                    on_error=on_error, pos=self.doc.pos(path))

    def read_fields(self, op: operations.Operation, raw: dict[str, Any], path: PathKey,
                    reserved: tuple[str, ...] = ()) -> tuple[dict[str, Any], bool]:
        """Coerce ``op``'s fields from ``raw`` (keys in ``reserved`` belong to the caller)."""
        args: dict[str, Any] = {}
        ok = True
        for key, value in raw.items():
            if key in reserved:
                continue
            spec = op.fields.get(key)
            if spec is None:
                hint = _did_you_mean(key, list(op.fields) + list(reserved))
                allowed = ", ".join(list(op.fields) + list(reserved))
                self.add(path + (key,), f"unknown field {key!r} for {op.name}{hint} (fields: {allowed})", key=True)
                ok = False
                continue
            if value is None:
                continue  # `field: ~` means "not given"
            before = self.mark()
            value = self.subst(value, path + (key,))
            if self.mark() != before:
                ok = False
                continue
            try:
                args[key] = operations.coerce(spec, value)
            except ValueError as err:
                self.add(path + (key,), f"{op.name} {key}: {err}")
                ok = False
        for key, spec in op.fields.items():
            if key in args or (raw.get(key) is not None and key not in reserved):
                continue  # given (and, if bad, already reported)
            if spec.required:
                self.add(path, f"{op.name}: missing required field {key!r}", key=True)
                ok = False
            elif spec.default is not None:
                args[key] = spec.default
        return args, ok

    def read_args(self, op: operations.Operation, raw: Any, path: PathKey) -> dict[str, Any] | None:
        if raw is None:
            raw = {}
        elif not isinstance(raw, dict):
            if op.shorthand is None or isinstance(raw, list):
                self.add(path, f"{op.name} takes a mapping of fields ({', '.join(op.fields)})")
                return None
            raw = {op.shorthand: raw}
            self.doc.values.setdefault(path + (op.shorthand,), self.doc.pos(path))
        args, ok = self.read_fields(op, raw, path)
        if not ok:
            return None
        if op.check is not None:
            for field_name, message in op.check(args):
                where = path + (field_name,) if field_name and field_name in raw else path
                self.add(where, f"{op.name}: {message}", key=where == path)
                ok = False
        return args if ok else None

    # --- conditions ------------------------------------------------------------------------

    def read_condition(self, raw: dict[str, Any], path: PathKey, extra: tuple[str, ...]) -> Condition | None:
        """``path`` + exactly one comparator; keys in ``extra`` are the caller's."""
        ok = True
        for key in raw:
            if key not in COMPARATORS and key != "path" and key not in extra:
                allowed = ", ".join(("path",) + COMPARATORS + extra)
                self.add(path + (key,), f"unknown key {key!r}{_did_you_mean(key, ('path',) + COMPARATORS + extra)} "
                                        f"(allowed: {allowed})", key=True)
                ok = False
        chosen = [k for k in raw if k in COMPARATORS]
        if not chosen and not ok:
            return None  # the unknown key (probably a misspelt comparator) says enough
        if len(chosen) != 1:
            what = "no comparator" if not chosen else f"{len(chosen)} comparators ({', '.join(chosen)})"
            self.add(path, f"a condition needs exactly one of {', '.join(COMPARATORS)}; found {what}")
            return None
        where = self.text(raw, "path", path) or ""
        try:
            split_path(where)
        except ValueError as err:
            self.add(path + ("path",), str(err))
            ok = False
        op = chosen[0]
        before = self.mark()
        expected = self.subst(raw[op], path + (op,))
        if self.mark() != before:
            return None
        if op in ("gt", "gte", "lt", "lte"):
            try:
                if isinstance(expected, bool):
                    raise ValueError
                float(expected)
            except (TypeError, ValueError):
                self.add(path + (op,), f"{op} needs a number, got {expected!r}")
                ok = False
        elif op == "length":
            try:
                expected = operations.coerce(operations.Field("int", min=0), expected)
            except ValueError as err:
                self.add(path + (op,), f"length: {err}")
                ok = False
        elif op == "exists":
            try:
                expected = operations.coerce(operations.Field("bool"), expected)
            except ValueError as err:
                self.add(path + (op,), f"exists: {err}")
                ok = False
        if not ok:
            return None
        return Condition(where, op, expected, self.doc.pos(path))

    def read_expect(self, raw: Any, path: PathKey) -> list[Condition]:
        if raw is None:
            return []
        items = [(raw, path)] if isinstance(raw, dict) else (
            [(item, path + (i,)) for i, item in enumerate(raw)] if isinstance(raw, list) else None)
        if items is None:
            self.add(path, "expect must be a condition {path: ..., equals: ...} or a list of them")
            return []
        out = []
        for item, where in items:
            if not isinstance(item, dict):
                self.add(where, "expect items must be mappings such as {path: partition_count, equals: 3}")
                continue
            cond = self.read_condition(item, where, ())
            if cond is not None:
                out.append(cond)
        return out

    def read_wait_for(self, raw: Any, path: PathKey) -> WaitFor | None:
        targets = operations.describers()
        if not isinstance(raw, dict):
            self.add(path, "wait_for must be a mapping such as "
                           "{describe: topics, topic: orders, path: tiered_state, equals: DISABLED, timeout: 60s}")
            return None
        target = self.text(raw, "describe", path)
        if target is None:
            self.add(path, f"wait_for needs describe: one of {', '.join(targets)}")
            return None
        op = targets.get(target)
        if op is None:
            self.add(path + ("describe",), f"wait_for cannot describe {target!r}{_did_you_mean(target, list(targets))} "
                                           f"(one of: {', '.join(targets)})")
            return None
        reserved = WAIT_KEYS + COMPARATORS
        args, ok = self.read_fields(op, raw, path, reserved)
        if ok and op.check is not None:
            for field_name, message in op.check(args):
                self.add(path + ((field_name,) if field_name in raw else ()), f"wait_for: {message}")
                ok = False
        # other keys were checked by read_fields just above: hand over only the condition's own
        cond = self.read_condition({k: v for k, v in raw.items() if k in COMPARATORS or k == "path"}, path, ())
        timeout, interval = DEFAULT_WAIT_TIMEOUT_S, DEFAULT_WAIT_INTERVAL_S
        for key in ("timeout", "interval"):
            if raw.get(key) is None:
                continue
            before = self.mark()
            text = self.subst(raw[key], path + (key,))
            if self.mark() != before:
                ok = False
                continue
            try:
                value = parse_duration(text)
            except ValueError as err:
                self.add(path + (key,), f"wait_for {key}: {err}")
                ok = False
                continue
            if key == "timeout":
                timeout = value
            elif value <= 0:
                self.add(path + (key,), "wait_for interval must be above 0")
                ok = False
            else:
                interval = value
        if not ok or cond is None:
            return None
        return WaitFor(op.name, args, cond, timeout, interval)


def validate(doc: Document, cli_vars: dict[str, str] | None = None) -> tuple[Runbook | None, list[Problem]]:
    """The runbook, or None with the problems (sorted by position) when there is any."""
    v = _Validator(doc, dict(cli_vars or {}))
    runbook = v.run()
    problems = sorted(dict.fromkeys(v.problems), key=lambda p: (p.line, p.column))
    return (runbook if not problems else None), problems
