"""Load and dump graph YAML: safe loading, line numbers, ``key.path=value`` overrides.

YAML is only ever loaded safely (``yaml.CSafeLoader``, libyaml's parser, where
PyYAML has it; ``yaml.SafeLoader`` otherwise): tags such as ``!!python/object``
are errors, never code. Loading is bounded before anything walks the
document: at most 1 MB of text, 100,000 values once aliases are expanded
(a "billion laughs" of nested aliases is refused in linear time, not walked)
and 32 levels of nesting. Every error names the file and line it is about:

>>> load_text("nodes: {update: {kind: update, pool: trainer, lr: -1}}", "g.yaml")
Traceback (most recent call last):
...
omnigraph.errors.GraphError: g.yaml:1: nodes.update.lr: Input should be greater than 0 (fix: ...)
"""

from __future__ import annotations

import contextlib
import difflib
import gc
import os
from pathlib import Path
from typing import Any, Iterator, get_args, get_origin

import yaml
from pydantic import ValidationError

from .. import plugins
from ..errors import GraphError, GraphErrors
from ..sdk import options_model
from .spec import NODE_KINDS, GraphSpec, NodeSpec

MAX_BYTES = 1_000_000
MAX_DEPTH = 32
MAX_NODES = 100_000
"""The most values (scalars, keys, lists and mappings) a document may hold once its aliases are expanded:
a real graph has a few hundred."""


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """libyaml's safe loader where PyYAML was built with it (it composes a megabyte in about a second, the
    pure-Python one in tens of seconds; both are safe, their syntax-error wording differs), whose values
    that cannot be built (``!!int x``, ``!!bool x``, a 5000-digit number, month 13) are YAML errors with
    their line, not tracebacks."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as e:  # noqa: BLE001 - ValueError, KeyError ('!!bool x'), AttributeError ('!!timestamp x')...
            value = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            why = f": {str(e).split(';')[0]}" if isinstance(e, (ValueError, ArithmeticError)) else ""
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {str(value)[:40]!r} as {node.tag.rsplit(':', 1)[-1]}{why}",
                node.start_mark) from None


def load_file(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> GraphSpec:
    """Read a graph YAML file, apply ``key.path=value`` overrides, validate the schema.

    A relative ``task.source`` written in the file is relative to the file's folder: it is made absolute here,
    before the overrides apply (a ``task.source=...`` override stays relative to the working directory), unless
    it names a registered task (``reasoning_gym``); so is an agent's ``entry`` in a file (``agent.py:solve``)."""
    p = Path(path)
    if not p.is_file():
        raise GraphError(f"no such file '{path}'", fix="pass the path of a graph YAML, e.g. graphs/grpo_one_step_off.yaml")
    if p.stat().st_size > MAX_BYTES:
        raise GraphError(f"file is {p.stat().st_size} bytes, more than {MAX_BYTES}", source=str(path))
    try:
        text = p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as e:
        raise GraphError(f"cannot read the file: {e}", source=str(path)) from None
    raw, lines = parse_yaml(text, str(path))
    task = raw.get("task")
    source = task.get("source") if isinstance(task, dict) else None
    if isinstance(source, str) and source and not source.startswith("~") and not os.path.isabs(source) \
            and not plugins.has("tasks", source):
        task["source"] = os.path.normpath(os.path.join(os.path.abspath(p.parent), source))
    for node in (raw.get("nodes") or {}).values() if isinstance(raw.get("nodes"), dict) else ():
        agent = node.get("agent") if isinstance(node, dict) else None
        entry = agent.get("entry") if isinstance(agent, dict) else None
        if isinstance(entry, str) and ".py:" in entry and not os.path.isabs(entry):    # an agent in a file
            agent["entry"] = os.path.normpath(os.path.join(os.path.abspath(p.parent), entry))
    given: dict[tuple, str] = {}
    for item in overrides:             # as load_text does, on the document with its source resolved
        raw = apply_override(raw, item)
        key = tuple(item.partition("=")[0].strip().split("."))
        given[key] = item
        for at in [q for q in lines if q[:len(key)] == key]:
            del lines[at]
    return validate_raw(raw, str(path), lines, given)


def load_text(text: str, source: str = "<yaml>", overrides: list[str] | tuple[str, ...] = ()) -> GraphSpec:
    raw, lines = parse_yaml(text, source)
    given: dict[tuple, str] = {}
    for item in overrides:
        raw = apply_override(raw, item)
        key = tuple(item.partition("=")[0].strip().split("."))
        given[key] = item
        for path in [p for p in lines if p[:len(key)] == key]:     # the file's lines no longer hold these values
            del lines[path]
    return validate_raw(raw, source, lines, given)


def parse_yaml(text: str, source: str) -> tuple[dict, dict[tuple, int]]:
    """Parse safely; return the document and a map from key paths to line numbers.

    The text is composed once into a node graph, whose size (aliases expanded) and depth are
    measured before anything walks it; the document is then constructed from the same nodes.
    """
    if len(text) > MAX_BYTES:
        raise GraphError(f"the YAML is {len(text)} characters, more than {MAX_BYTES}", source=source)
    lines: dict[tuple, int] = {}
    try:
        with _no_gc():
            data = _load(text, source, lines)
    except yaml.YAMLError as e:
        raise _yaml_error(e, source) from None
    except RecursionError:
        raise GraphError("the YAML nests too deeply", source=source) from None
    except UnicodeError as e:       # a lone surrogate in a str handed to load_text
        raise GraphError(f"the YAML is not valid text: {e}", source=source, fix="save the file as UTF-8") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise GraphError(f"the document must be a mapping of fields, not {type(data).__name__}",
                         source=source, line=1, fix="start from graphs/grpo_one_step_off.yaml")
    return data, lines


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Without the cyclic garbage collector while a document is parsed: the parse makes up to MAX_NODES
    objects, and each collection they trigger scans every object of the process (in a process that has
    loaded torch and transformers, that made a refused 120,000-value document take 3 s instead of 0.8)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _load(text: str, source: str, lines: dict[tuple, int] | None = None) -> Any:
    """Compose once, check the node graph's size, fill ``lines``, construct from the same nodes."""
    # libyaml counts the parse events of a megabyte in ~0.2 s without building anything, where composing
    # it takes seconds: a document of more events than MAX_NODES values can make is refused unbuilt
    if hasattr(_Loader, "raw_parse") and _Loader(text).raw_parse() > 2 * MAX_NODES + 4:
        raise _too_many(source)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, source)
        if lines is not None:
            _index_lines(node, (), lines)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_error(e: yaml.YAMLError, source: str) -> GraphError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = mark.line + 1 if mark else None
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    ctx, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if ctx and cmark is not None and cmark.line + 1 != line:
        problem += f" ({ctx} started on line {cmark.line + 1})"
    fix = "quote it to make it a string, or write a plain number or date" if problem.startswith("cannot read") \
        else "use plain YAML: mappings, lists, strings and numbers (tags like !!python/... are refused)" \
        if "tag" in str(e) or "constructor" in str(e) else "check the indentation and quoting on that line"
    return GraphError(f"invalid YAML: {problem}", line=line, source=source, fix=fix)


def _check_size(root: yaml.Node, source: str) -> None:
    """Refuse a composed document that would expand to more than MAX_NODES values or nest more than
    MAX_DEPTH levels, or whose aliases refer to themselves (``&a [*a]``).

    An alias is the very node its anchor names, so the node graph is a DAG (a cycle for a recursive
    alias) and a "billion laughs" has few nodes but an exponential expansion. Each list and mapping is
    measured once (memoised by identity, iteratively: no recursion limit), so a bomb is refused in
    time linear in its text. Depth is counted like the data's: a scalar is 0, a list or mapping 1 + its
    deepest item.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()     # lists and mappings on the path being measured: meeting one inside itself is a cycle
    written = 0                 # the items of the distinct lists and mappings: what composing built
    stack = [root] if isinstance(root, _COLLECTIONS) else []
    while stack:
        node = stack[-1]
        key = id(node)
        if key in open_:                                    # back from its items: measure it
            stack.pop()
            open_.discard(key)
            n = size[key] = 1 + sum(size.get(id(x), 1) for x in _items(node))     # a scalar is 1
            d = depth[key] = _depth(node, depth)
            if n > MAX_NODES:
                raise GraphError(f"the YAML expands to more than {MAX_NODES} values: aliases (*name) repeat "
                                 "values that hold more aliases, and the repeats multiply (nine levels of nine "
                                 "aliases are 9^9 = 387420489 values)", source=source,
                                 line=node.start_mark.line + 1, fix="write the document without repeated aliases")
            if d > MAX_DEPTH:
                raise GraphError(f"the YAML nests more than {MAX_DEPTH} levels deep", source=source,
                                 line=node.start_mark.line + 1)
            continue
        if key in size:                                     # measured already: an alias met again
            stack.pop()
            continue
        items = _items(node)
        written += len(items)
        if written > MAX_NODES:
            raise _too_many(source, node.start_mark.line + 1)
        open_.add(key)
        for x in items:
            if isinstance(x, _COLLECTIONS) and id(x) not in size:
                if id(x) in open_:
                    raise GraphError("the YAML refers to itself: an alias (*name) inside the value of its own "
                                     "anchor (&name) repeats forever", source=source, line=x.start_mark.line + 1,
                                     fix="remove the alias, or point it at a value defined before it")
                stack.append(x)


_COLLECTIONS = (yaml.MappingNode, yaml.SequenceNode)


def _depth(node: yaml.Node, depth: dict[int, int]) -> int:
    """A list's or mapping's nesting, its items measured: 1 + its deepest item's (a scalar's is 0). A merge
    (``<<: *base`` or ``<<: [*a, *b]``) puts the merged mappings' keys in this one: one level up."""
    if isinstance(node, yaml.SequenceNode):
        return 1 + max((depth.get(id(x), 0) for x in node.value), default=0)
    d = 0
    for k, v in node.value:
        dv = depth.get(id(v), 0)
        if k.tag == "tag:yaml.org,2002:merge":
            dv -= 1 if isinstance(v, yaml.MappingNode) else 2 if isinstance(v, yaml.SequenceNode) else 0
        d = max(d, depth.get(id(k), 0), dv)
    return 1 + d


def _too_many(source: str, line: int | None = None) -> GraphError:
    return GraphError(f"the YAML holds more than {MAX_NODES} values", source=source, line=line,
                      fix="a graph needs a few hundred: shorten the long lists")


def _items(node: yaml.Node) -> list[yaml.Node]:
    """A list's items; a mapping's keys and values."""
    return [x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode) else node.value


def _index_lines(node: yaml.Node, path: tuple, out: dict[tuple, int]) -> None:
    if len(path) > MAX_DEPTH:       # deep, or a recursive alias such as &a [*a]
        return
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            out[path + (key,)] = k.start_mark.line + 1
            _index_lines(v, path + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _index_lines(v, path + (i,), out)


def apply_override(raw: dict, item: str) -> dict:
    """``nodes.update.lr=3e-4``: set a value by dotted path; the value is parsed as YAML."""
    if "=" not in item:
        raise GraphError(f"override '{item}' is not of the form key.path=value", fix="e.g. schedule.iterations=10")
    key, _, text = item.partition("=")
    parts = [p for p in key.strip().split(".")]
    if not all(parts):
        raise GraphError(f"override '{item}': empty key", fix="e.g. schedule.iterations=10")
    try:
        value = _load(text, f"override '{item}'") if text.strip() else ""
    except (yaml.YAMLError, UnicodeError):
        value = text
    if len(parts) > 2 and parts[0] in ("nodes", "pools") and isinstance(raw.get(parts[0]), dict) \
            and parts[1] not in raw[parts[0]]:
        known = sorted(raw[parts[0]])
        close = difflib.get_close_matches(parts[1], known, n=1)
        what = "node" if parts[0] == "nodes" else "pool"
        raise GraphError(f"no {what} '{parts[1]}'" + (f" (did you mean '{close[0]}'?)" if close else "")
                         + f" ({what}s: {', '.join(known)})", where=f"{parts[0]}.{parts[1]}",
                         source=f"override '{item}'",
                         fix=f"use '{'.'.join([parts[0], close[0], *parts[2:]])}={text}'" if close else
                         f"name one of the {what}s, or add the {what} whole: {parts[0]}.{parts[1]}={{...}}")
    target: Any = raw
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[: i + 1])
        if isinstance(target, list):
            if not part.isdigit() or int(part) >= len(target):
                raise GraphError(f"override '{item}': '{where}' is not an index into a list of {len(target)}")
            idx = int(part)
            if last:
                target[idx] = value
            else:
                target = target[idx]
            continue
        if not isinstance(target, dict):
            raise GraphError(f"override '{item}': '{'.'.join(parts[:i])}' is not a mapping")
        if last:
            target[part] = value
        else:
            if target.get(part) is None:
                target[part] = {}
            target = target[part]
    return raw


def validate_raw(raw: dict, source: str = "<yaml>", lines: dict[tuple, int] | None = None,
                 overrides: dict[tuple, str] | None = None) -> GraphSpec:
    """``raw`` as a GraphSpec; an error names the field and the YAML line, or the command-line override
    (``overrides``: key path -> the ``key=value`` text) that set it."""
    lines = lines or {}
    try:
        return GraphSpec.model_validate(raw)
    except ValidationError as e:
        errors = [_translate(err, source, lines, raw, overrides or {}) for err in e.errors()[:8]]
        raise (errors[0] if len(errors) == 1 else GraphErrors(errors)) from None
    except RecursionError:
        raise GraphError("the document nests too deeply", source=source) from None


def _translate(err: dict, source: str, lines: dict[tuple, int], raw: Any = None,
               overrides: dict[tuple, str] | None = None) -> GraphError:
    loc = _clean_loc(err["loc"])
    where = ".".join(str(p) for p in loc) or "(document)"
    line = None
    for n in range(len(loc), -1, -1):
        if loc[:n] in (overrides or {}):            # set on the command line: say that, not a line of the file
            source, line = f"override '{overrides[loc[:n]]}'", None
            break
        if loc[:n] in lines:
            line = lines[loc[:n]]
            break
    kind = err["type"]
    msg = err["msg"]
    if kind == "extra_forbidden":
        field = loc[-1] if loc else "?"
        known, option = _known_fields(loc[:-1], raw, field)
        close = difflib.get_close_matches(str(field), known, n=1)
        if option:
            return GraphError(f"unknown field '{field}': it is an option of backend {option}", where=where, line=line,
                              source=source, fix=f"write it under options: (options: {{{field}: ...}})")
        return GraphError(f"unknown field '{field}'" + (f" (did you mean '{close[0]}'?)" if close else ""),
                          where=where, line=line, source=source,
                          fix=f"use '{close[0]}'" if close else f"remove '{field}' or correct its spelling")
    if kind == "union_tag_invalid" or kind == "union_tag_not_found":
        return GraphError(f"{msg}", where=where, line=line, source=source,
                          fix=f"set kind to one of: {', '.join(NODE_KINDS)}")
    if kind == "missing":
        return GraphError("required field is missing", where=where, line=line, source=source,
                          fix=f"add '{loc[-1]}'")
    return GraphError(msg.removeprefix("Value error, "), where=where, line=line, source=source,
                      fix=_FIXES.get(kind, "see the field's documentation in omnigraph/graph/spec.py (and spec_rollout.py)"))


def _known_fields(parent: tuple, raw: Any, field: Any = None) -> tuple[list[str], str | None]:
    """The field names of the schema at ``parent`` (a section, a node, a pool), found from the raw document; and,
    for a node whose backend's own options hold ``field``, that backend (the field belongs under ``options:``)."""
    model: Any = GraphSpec
    keyed = False                                   # the last step was a mapping of names (pools, nodes): skip a key
    for i, part in enumerate(parent):
        if keyed:
            keyed = False
            continue
        info = getattr(model, "model_fields", {}).get(part) if isinstance(part, str) else None
        if info is None:
            return [], None
        if part == "nodes" and i + 1 < len(parent) and len(parent) == i + 2:
            return _node_fields(parent[i + 1], raw, field)
        ann = info.annotation
        if get_origin(ann) is dict:
            ann, keyed = get_args(ann)[1], True
        args = [a for a in get_args(ann) if isinstance(a, type) and hasattr(a, "model_fields")]
        model = args[0] if args else ann
        if not (isinstance(model, type) and hasattr(model, "model_fields")):
            return [], None
    return list(getattr(model, "model_fields", {})), None


def _node_fields(name: Any, raw: Any, field: Any) -> tuple[list[str], str | None]:
    node = ((raw or {}).get("nodes") or {}).get(name) if isinstance(raw, dict) else None
    if not isinstance(node, dict):
        return [], None
    classes = {c.model_fields["kind"].annotation.__args__[0]: c for c in get_args(get_args(NodeSpec)[0])}
    model = classes.get(node.get("kind"))
    if model is None:
        return [], None
    backend = node.get("backend") or getattr(model.model_fields.get("backend"), "default", None)
    option = None
    if backend and field is not None:
        try:
            opts = options_model(plugins.backend(node["kind"], backend))
            option = backend if opts is not None and field in opts.model_fields else None
        except Exception:  # noqa: BLE001 - a hint only: an unknown backend is reported on its own
            option = None
    return list(model.model_fields), option


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union-tag and validator entries: ``nodes.update.update.lr`` -> ``nodes.update.lr``."""
    loc = tuple(p for p in loc if not (isinstance(p, str) and "[" in p))
    if len(loc) > 2 and loc[0] == "nodes" and loc[2] in NODE_KINDS:
        loc = loc[:2] + loc[3:]
    return loc

_FIXES = {
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than": "use a smaller value",
    "less_than_equal": "use a smaller value",
    "literal_error": "use one of the listed values",
    "int_parsing": "write a whole number",
    "int_from_float": "write a whole number",
    "float_parsing": "write a number",
    "string_pattern_mismatch": "use letters, digits, '_' and '-' only, starting with a letter",
    "bool_parsing": "write true or false",
    "dict_type": "write a mapping (key: value)",
    "list_type": "write a list (- item)",
    "string_type": "write a string",
}


def dump(spec: GraphSpec, *, exclude_defaults: bool = True) -> str:
    """The spec as YAML; ``load_text(dump(spec)) == spec``."""
    data = spec.model_dump(mode="json", exclude_defaults=exclude_defaults)
    if exclude_defaults:
        # keep each node's kind and pool: they make the file readable and are required
        data["nodes"] = {name: {"kind": n.kind, "pool": n.pool, **data.get("nodes", {}).get(name, {})}
                         for name, n in spec.nodes.items()}
        data["edges"] = [e.model_dump() for e in spec.edges]
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
