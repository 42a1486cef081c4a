"""The bag file: which tasks to run, and how each one runs.

Schema (``timeout`` and exactly one task source are required)::

    name: sweep                  # default: the file's stem
    command: "sim --t {t} --seed {seed}"    # a str.format template ...
    sweep:                       # ... filled with every combination (cartesian product)
      t: [0.1, 0.2]              #   a list of values
      seed: {range: [1, 50]}     #   integers start..stop-1 (optional third item: step)
      x: {linspace: [0, 1, 5]}   #   n evenly spaced numbers from a to b inclusive
    unquoted: [x]                # parameters whose values are shell syntax (default: none)
    tasks_file: commands.txt     # or: one command per line (# comments, blank lines skipped)
    csv: tasks.csv               # or: columns command, id (optional), estimate_<tool> (seconds)
    timeout: 1h                  # per-task limit, also R_max for sampling; > 0
    retries: 2                   # attempts after the first failure, >= 0
    setup: "pip install ..."     # run once per node before its first task
    workdir: ~/work              # on the node (so ``~`` is left for the node to expand)
    env: {OMP_NUM_THREADS: "1"}  # string values
    outputs: "out/{task}.csv"    # a file or directory each task leaves, fetched after it succeeds
                                 #   into RUN_DIR/outputs/<task>/; relative to workdir; may use
                                 #   {task} and the sweep's parameters

Sweep values are shell-quoted where they are filled in, for the quoting context the
placeholder sits in: a bare ``{x}`` becomes one shell word (``'; touch x'``), inside
``'...'`` a value's ``'`` is closed and escaped, inside ``"..."`` its ``$``, backquote, ``"``
and backslash are escaped. So ``; touch x``, ``$(...)``, backquotes and ``x' y`` reach the
command as text, never run. A parameter listed under ``unquoted`` is filled in as written
(the explicit opt-out for values that are shell syntax: ``"a | b"``, ``"> out.txt"``); the
``{task}``/parameter template of ``outputs`` is a path, never quoted. ``load_bag(...,
warnings=[])`` collects warnings: values with shell metacharacters (quoted, so harmless, but
maybe meant as syntax) and the values of unquoted parameters. A placeholder right after an
escaping backslash is refused: the shell would take the value's first character as escaped.

File paths are relative to the bag file. Task ids come from the CSV ``id`` column when there
is one, else from the position: ``t000001``, ``t000002``, ... Sweep tasks are numbered in
the product's order, the first parameter varying slowest, and carry their ``params``.
Problems in a task file or CSV cite that file and the row's own line.
"""

from __future__ import annotations

import csv
import difflib
import io
import itertools
import math
import os
import re
import string
from pathlib import Path
from typing import Sequence

from broker.core.model import Bag, Task

from .errors import ConfigError, Problem
from .fields import Checker, describe, is_identifier, join, suggestion
from .shell_words import SHELL_META, CommandFiller
from .yamlsource import Node, load_yaml

_TASK_SOURCES = ("command", "tasks_file", "csv")
_OPTIONAL_KEYS = ("name", "sweep", "unquoted", "retries", "setup", "workdir", "env", "outputs", *_TASK_SOURCES)
_DEFAULT_RETRIES = 2
# A sweep larger than this is almost surely a mistake (a range with a missing zero, say).
MAX_TASKS = 10_000_000
# linspace values are rounded to this many significant digits so commands read 0.3, not 0.30000000000000004.
_LINSPACE_DIGITS = 12
_ESTIMATE_PREFIX = "estimate_"


def load_bag(path: str | os.PathLike[str], warnings: list[Problem] | None = None) -> Bag:
    """Read and validate the bag at ``path``; :class:`ConfigError` lists every problem, and
    ``warnings`` (when given) receives what is suspicious but allowed."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Problem(source, None, "bag file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Problem(source, None, f"cannot read the bag file: {exc}")]) from None
    return parse_bag(text, source, Path(path).parent, warnings=warnings)


def parse_bag(text: str, source: str = "<bag>", base_dir: str | os.PathLike[str] | None = None,
              warnings: list[Problem] | None = None) -> Bag:
    """Validate bag YAML ``text``; task files are looked up in ``base_dir`` (default: ``source``'s folder)."""
    base = Path(base_dir) if base_dir is not None else Path(source).parent
    root = load_yaml(text, source)
    check = Checker(source)
    fields = check.mapping(root, "", required=("timeout",), optional=_OPTIONAL_KEYS)
    if fields is None:  # not a mapping at all: nothing more to say
        check.raise_if_any()
    data_checks: list[Checker] = []
    warn = Checker(source)  # its "problems" are warnings: they refuse nothing
    tasks = _tasks(check, fields, root, base, data_checks, warn)

    timeout_s = check.duration(fields["timeout"], "timeout", positive=True) if "timeout" in fields else None
    retries = check.integer(fields["retries"], "retries", minimum=0) if "retries" in fields else _DEFAULT_RETRIES
    optional_strings = {
        key: check.string(fields[key], key) if key in fields else None for key in ("setup", "workdir", "outputs")
    }
    env = check.string_map(fields.get("env"), "env", what="environment variable name", identifier_keys=True)
    name = check.string(fields["name"], "name") if "name" in fields else _default_name(source)

    if optional_strings["outputs"] is not None:
        _check_outputs(check, fields["outputs"], optional_strings["outputs"], tasks)
    problems = [p for c in (check, *data_checks) for p in _in_line_order(c.problems)]
    if warnings is not None:
        warnings.extend(_in_line_order(warn.problems))
    if problems:
        raise ConfigError(problems)
    return Bag(
        tasks=tuple(tasks),
        timeout_s=timeout_s,
        retries=retries,
        env=env or {},
        name=name,
        source=source,
        **optional_strings,
    )


def _check_outputs(check: Checker, node: Node, outputs: str, tasks: list[Task]) -> None:
    """``outputs`` may name ``{task}`` and the sweep's parameters, nothing else; no ``$VAR``."""
    allowed = {"task", *(tasks[0].params if tasks else ())}
    try:
        names = _placeholders(outputs)
    except ValueError as exc:
        check.problem("outputs", f"bad template: {exc}", node.where)
        return
    for name in names:
        if name not in allowed:
            check.problem("outputs", f"placeholder {{{name}}} is neither {{task}} nor a sweep parameter"
                          + suggestion(name, allowed), node.where)
    if "$" in outputs:
        check.problem("outputs", "environment variables are not expanded in outputs (they are in workdir): "
                      "use a path relative to workdir, an absolute one, or ~/", node.where)


def output_path(bag: Bag, task: Task) -> str | None:
    """Where ``task``'s outputs are on its node: ``bag.outputs`` filled with ``{task}`` and its
    parameters; relative paths are relative to the task's working directory."""
    if bag.outputs is None:
        return None
    return bag.outputs.format(task=task.id, **task.params)


def _default_name(source: str) -> str:
    return "bag" if source.startswith("<") else Path(source).stem


def _in_line_order(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0))


def _tasks(
    check: Checker, fields: dict[str, Node], root: Node | None, base: Path, data_checks: list[Checker],
    warn: Checker,
) -> list[Task]:
    """The tasks from the bag's one task source; ``[]`` once a problem is reported.

    Problems inside a task file or CSV go to a checker of their own (appended to
    ``data_checks``), so that they cite that file and its lines.
    """
    source_key = _task_source(check, fields, root)
    if source_key is None:
        return []
    if source_key == "command":
        return _sweep_tasks(check, fields["command"], fields["sweep"], fields.get("unquoted"), warn)
    data = _read_data_file(check, fields[source_key], source_key, base)
    if data is None:
        return []
    data_path, data_text = data
    data_check = Checker(str(data_path))
    data_checks.append(data_check)
    reader = _file_tasks if source_key == "tasks_file" else _csv_tasks
    tasks = reader(data_check, data_text)
    if data_check.problems:
        return []
    if not tasks:
        check.problem(source_key, f"the bag has no tasks: {data_path} lists no commands", fields[source_key].where)
    return tasks


def _task_source(check: Checker, fields: dict[str, Node], root: Node | None) -> str | None:
    """``command`` (with its sweep), ``tasks_file`` or ``csv``: exactly one, or a problem."""
    given = [key for key in _TASK_SOURCES if key in fields]
    if not given:
        where = root.line if root is not None else None
        check.problem(None, "the bag names no tasks: give command + sweep, tasks_file, or csv", where)
        return None
    if len(given) > 1:
        check.problem(given[1], f"give only one task source; this bag has {' and '.join(given)}", fields[given[1]].where)
        return None
    source_key = given[0]
    for key in ("sweep", "unquoted"):
        if key in fields and source_key != "command":
            check.problem(key, f"{key} fills a command template; it does not apply to {source_key}", fields[key].where)
            return None
    if source_key == "command" and "sweep" not in fields:
        check.problem(
            "sweep",
            "command is a template and needs a sweep of the parameters to fill in "
            "(for a fixed list of commands use tasks_file)",
            fields["command"].where,
        )
        return None
    return source_key


# -- command + sweep ----------------------------------------------------------------------
def _sweep_tasks(
    check: Checker, command_node: Node, sweep_node: Node, unquoted_node: Node | None, warn: Checker
) -> list[Task]:
    """Fill the template with every combination of the sweep's values, each quoted for its place."""
    template = check.string(command_node, "command", what="a command template")
    sweep = _sweep(check, sweep_node)
    unquoted = _unquoted(check, unquoted_node, sweep)
    if template is None or sweep is None or unquoted is None:
        return []
    try:
        used = _placeholders(template)
        fill = CommandFiller(template, unquoted)
    except ValueError as exc:
        check.problem("command", f"bad template: {exc}", command_node.where)
        return []
    consistent = True
    for name in used:
        if name not in sweep:
            consistent = False
            check.problem(
                "command",
                f"placeholder {{{name}}} is not a sweep parameter{suggestion(name, sweep)}",
                command_node.where,
            )
    for name in sweep:
        if name not in used:
            consistent = False
            check.problem(
                join("sweep", name),
                f"sweep parameter '{name}' is not used in the command (write {{{name}}} where it goes)",
                sweep_node.value[name].where,
            )
    if not consistent:
        return []
    count = math.prod(len(values) for values in sweep.values())
    if count > MAX_TASKS:
        check.problem("sweep", f"the sweep makes {count:,} tasks, more than the {MAX_TASKS:,} allowed", sweep_node.where)
        return []
    _warn_shell_syntax(warn, sweep, sweep_node, unquoted)
    names = list(sweep)
    tasks: list[Task] = []
    for position, combination in enumerate(itertools.product(*sweep.values()), start=1):
        params = dict(zip(names, combination))
        try:
            command = fill(params)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
            check.problem("command", f"cannot fill the template with {shown}: {exc}", command_node.where)
            return []
        tasks.append(Task(id=_positional_id(position), command=command, params=params))
    return tasks


def _unquoted(check: Checker, node: Node | None, sweep: dict[str, Sequence[object]] | None) -> frozenset[str] | None:
    """The parameters listed under ``unquoted`` (each must be a sweep parameter)."""
    if node is None:
        return frozenset()
    items = check.sequence(node, "unquoted")
    if items is None:
        return None
    names: set[str] = set()
    for index, item in enumerate(items):
        name = check.string(item, join("unquoted", index), what="a sweep parameter name")
        if name is None:
            return None
        if sweep is not None and name not in sweep:
            check.problem(join("unquoted", index), f"'{name}' is not a sweep parameter{suggestion(name, sweep)}",
                          item.where)
            return None
        names.add(name)
    return frozenset(names)


def _warn_shell_syntax(warn: Checker, sweep: dict[str, Sequence[object]], node: Node, unquoted: frozenset[str]) -> None:
    for name, values in sweep.items():
        if isinstance(values, range):  # integers: nothing to say
            continue
        meta = [str(v) for v in dict.fromkeys(values) if SHELL_META.search(str(v))]
        if not meta:
            continue
        shown = ", ".join(repr(v) for v in meta[:3]) + (f" and {len(meta) - 3} more" if len(meta) > 3 else "")
        if name in unquoted:
            message = (f"{len(meta)} value(s) with shell metacharacters ({shown}) are filled in unquoted "
                       f"(unquoted: [{name}]): the node's shell runs them as shell syntax")
        else:
            message = (f"{len(meta)} value(s) hold shell metacharacters ({shown}): each is passed quoted, as "
                       f"text; list {name} under unquoted if they are meant as shell syntax")
        warn.problem(join("sweep", name), message, node.value[name].where)


def _placeholders(template: str) -> list[str]:
    """Names of the ``{name}`` fields in a ``str.format`` template, format specs included.

    ``{t.real}`` and ``{x[0]}`` name ``t`` and ``x``. Positional fields (``{}``, ``{0}``) and
    unbalanced braces raise ``ValueError``.
    """
    names: list[str] = []
    for _literal, field, spec, _conversion in string.Formatter().parse(template):
        if field is None:
            continue
        root = re.split(r"[.\[]", field, maxsplit=1)[0]
        if root == "" or root.isdigit():
            raise ValueError(f"positional placeholder {{{field}}}: name the sweep parameter, e.g. {{seed}}")
        names.append(root)
        if spec:
            names.extend(_placeholders(spec))
    return list(dict.fromkeys(names))


def _sweep(check: Checker, node: Node) -> dict[str, Sequence[object]] | None:
    members = check.mapping_of_anything(node, "sweep")
    if members is None:
        return None
    if not members:
        check.problem("sweep", "the sweep names no parameters", node.where)
        return None
    sweep: dict[str, Sequence[object]] = {}
    ok = True
    for name, member in members.items():
        path = join("sweep", name)
        if not is_identifier(name):
            check.problem(path, f"'{name}' is not a valid parameter name (letters, digits and _)", member.where)
            ok = False
        values = _sweep_values(check, member, path)
        if values is None:
            ok = False
        else:
            sweep[name] = values
    return sweep if ok else None


def _sweep_values(check: Checker, node: Node, path: str) -> Sequence[object] | None:
    """A parameter's values: a list, ``{range: [start, stop(, step)]}`` or ``{linspace: [a, b, n]}``."""
    if node.is_sequence:
        values = []
        for index, item in enumerate(node.value):
            if item.value is None or isinstance(item.value, (dict, tuple)):
                check.problem(join(path, index), f"expected a number or a string, got {describe(item.value)}", item.where)
                return None
            values.append(item.value)
        if not values:
            check.problem(path, "the parameter has no values", node.where)
            return None
        return tuple(values)
    if not node.is_mapping:
        check.problem(
            path,
            f"expected a list of values, {{range: [start, stop]}} or {{linspace: [a, b, n]}}, got {describe(node.value)}",
            node.where,
        )
        return None
    fields = check.mapping(node, path, optional=("range", "linspace"))
    if fields is None:
        return None
    if len(fields) != 1:
        check.problem(path, "give exactly one of range or linspace", node.where)
        return None
    (kind, spec), = fields.items()
    spec_path = join(path, kind)
    if kind == "range":
        return _range_values(check, spec, spec_path)
    return _linspace_values(check, spec, spec_path)


def _range_values(check: Checker, node: Node, path: str) -> range | None:
    """The integers of a range, kept lazy so an oversized sweep is refused before it is built."""
    items = check.sequence(node, path)
    if items is None:
        return None
    if len(items) not in (2, 3):
        check.problem(path, "expected [start, stop] or [start, stop, step] (stop excluded)", node.where)
        return None
    numbers = [check.integer(item, join(path, index)) for index, item in enumerate(items)]
    if None in numbers:
        return None
    if len(numbers) == 3 and numbers[2] == 0:
        check.problem(path, "the step of a range cannot be 0", node.where)
        return None
    values = range(*numbers)
    if not values:
        check.problem(path, f"range {list(numbers)} is empty (stop is excluded)", node.where)
        return None
    return values


def _linspace_values(check: Checker, node: Node, path: str) -> tuple[float, ...] | None:
    items = check.sequence(node, path)
    if items is None:
        return None
    if len(items) != 3:
        check.problem(path, "expected [a, b, n]: n evenly spaced numbers from a to b inclusive", node.where)
        return None
    start = check.number(items[0], join(path, 0))
    stop = check.number(items[1], join(path, 1))
    count = check.integer(items[2], join(path, 2), minimum=1)
    if start is None or stop is None or count is None:
        return None
    if count == 1:
        return (start,)
    step = (stop - start) / (count - 1)
    return tuple(float(f"{start + step * i:.{_LINSPACE_DIGITS}g}") for i in range(count - 1)) + (stop,)


def _positional_id(position: int) -> str:
    return f"t{position:06d}"


# -- task files ---------------------------------------------------------------------------
def _read_data_file(check: Checker, node: Node, key: str, base: Path) -> tuple[Path, str] | None:
    """The path (relative to the bag file) and text of a tasks_file or csv."""
    name = check.string(node, key, what="a file path")
    if name is None:
        return None
    path = base / os.path.expanduser(name)
    try:
        # utf-8-sig drops the byte-order mark spreadsheet programs put before a CSV header.
        return path, path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        check.problem(key, f"file not found: {path}", node.where)
    except IsADirectoryError:
        check.problem(key, f"{path} is a directory, not a file", node.where)
    except UnicodeDecodeError as exc:
        check.problem(key, f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})", node.where)
    except OSError as exc:
        check.problem(key, f"cannot read {path}: {exc.strerror}", node.where)
    return None


def _file_tasks(_check: Checker, text: str) -> list[Task]:
    """One task per non-blank line that does not start with ``#`` (no line can be wrong)."""
    commands = (line.strip() for line in text.splitlines())
    kept = (command for command in commands if command and not command.startswith("#"))
    return [Task(id=_positional_id(position), command=command) for position, command in enumerate(kept, start=1)]


def _csv_tasks(check: Checker, text: str) -> list[Task]:
    """Rows of a CSV with a ``command`` column, an optional ``id`` and ``estimate_<tool>`` columns."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [cell.strip() for cell in next(reader)]
    except StopIteration:
        check.problem(None, "the CSV file is empty: it needs a header row with a command column", 1)
        return []
    except csv.Error as exc:
        check.problem(None, f"malformed CSV: {exc}", 1)
        return []
    if not _check_header(check, header):
        return []
    tools = {column: column[len(_ESTIMATE_PREFIX) :] for column in header if column.startswith(_ESTIMATE_PREFIX)}
    tasks: list[Task] = []
    first_line_of_id: dict[str, int] = {}
    position = 0  # of the row among the non-blank data rows, for positional ids
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            check.problem(None, f"malformed CSV: {exc}", line)
            return []
        if not row or all(not cell.strip() for cell in row):
            continue
        position += 1
        if len(row) != len(header):
            check.problem(None, f"the row has {len(row)} fields but the header has {len(header)}", line)
            continue
        cells = dict(zip(header, (cell.strip() for cell in row)))
        task = _csv_task(check, cells, tools, line, position, first_line_of_id)
        if task is not None:
            tasks.append(task)
    return tasks


def _check_header(check: Checker, header: list[str]) -> bool:
    ok = True
    seen: set[str] = set()
    for column in header:
        if column in seen:
            check.problem(column, f"column '{column}' appears twice in the header", 1)
            ok = False
        seen.add(column)
        if column in ("command", "id") or (column.startswith(_ESTIMATE_PREFIX) and len(column) > len(_ESTIMATE_PREFIX)):
            continue
        check.problem(column or None, f"unknown column '{column}'{_column_suggestion(column)}", 1)
        ok = False
    if "command" not in seen:
        check.problem("command", f"missing the required column 'command' (the header has: {', '.join(header)})", 1)
        ok = False
    return ok


def _column_suggestion(column: str) -> str:
    """A near miss of ``estimate_<tool>`` keeps its tool name; others are matched to command and id."""
    prefix, underscore, tool = column.partition("_")
    if underscore and tool and difflib.get_close_matches(prefix, ["estimate"], n=1, cutoff=0.6):
        return f" (did you mean '{_ESTIMATE_PREFIX}{tool}'?)"
    return f"{suggestion(column, ('command', 'id'))}; estimate columns are named {_ESTIMATE_PREFIX}<tool>"


def _csv_task(
    check: Checker,
    cells: dict[str, str],
    tools: dict[str, str],
    line: int,
    position: int,
    first_line_of_id: dict[str, int],
) -> Task | None:
    ok = True
    command = cells["command"]
    if not command:
        check.problem("command", "the command is empty", line)
        ok = False
    task_id = _positional_id(position)
    if "id" in cells:
        task_id = cells["id"]
        if not task_id:
            check.problem("id", "the id is empty (leave out the id column to number tasks by position)", line)
            ok = False
        elif task_id in first_line_of_id:
            check.problem("id", f"duplicate task id '{task_id}' (first on line {first_line_of_id[task_id]})", line)
            ok = False
        else:
            first_line_of_id[task_id] = line
    estimates_s: dict[str, float] = {}
    for column, tool in tools.items():
        cell = cells[column]
        if not cell:  # this tool has no estimate for this task
            continue
        value = _seconds_or_none(cell)
        if value is None:
            check.problem(column, f"expected an estimate in seconds (a number >= 0), got {cell!r}", line)
            ok = False
        else:
            estimates_s[tool] = value
    return Task(id=task_id, command=command, estimates_s=estimates_s) if ok else None


def _seconds_or_none(cell: str) -> float | None:
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
