"""Bounds on a JSON request body's shape, checked before anything is built from it.

Why: the memory a request takes is not its size. Parsed, a JSON key, an empty array or a number in a ``list[float]``
field costs 8-30 times the bytes it was sent as, and pydantic collects one error per offending item, each of which
FastAPI turns into a dict of its own (~1.5 kB): a 9 MB body of unknown keys took a service from 256 to 1,260 MB and
12.8 s of CPU before its 422, and 9 MB of numbers where a list of objects belongs, 7 GB. `JsonBodyGuard` (an ASGI
middleware `shared.service_app.create_service_app` puts in front of every service's routes) refuses such a body with
a 422 in the standard error body before pydantic sees it, in two steps:

1. On the raw bytes, before any JSON parser runs (`check_raw`): the body must be UTF-8 and hold at most
   ``TASMOE_MAX_JSON_DEPTH`` levels of nesting, ``TASMOE_MAX_JSON_KEYS`` object keys and ``TASMOE_MAX_JSON_VALUES``
   values. These bound what parsing can cost whatever the body's size (a value costs 8-60 bytes parsed and
   validated, a key ~100). A scan at C speed (``bytes.translate``/``split``, numpy for the depth): ~0.2 ms for a
   125 kB window request. Field ``body``.
2. When the route reads the body (routing has then chosen the route: ``scope["route"]``), a body of more than 4,096
   keys, 1,024 arrays and objects or 32,768 values is parsed with orjson and walked along the route's request model
   (`body_check`): the first key an ``extra="forbid"`` model does not know, and, in the items of a list or dict of
   models, the first item that is not an object or lacks a required field are refused naming the field
   (``workload.model.bogus: unknown key``), as pydantic names it. Past 32,768 values the body is then validated by a
   fail-fast copy of pydantic's own validator (`fail_fast_validator`): one error a collection instead of one a wrong
   value. The parse is dropped before the route parses the body itself. A smaller body goes to the route as it is:
   pydantic's errors there are at most ~64,000 (~100 MB), and the window requests (~1,600 keys, ~600 arrays and
   objects, ~15,000 values) are not parsed twice.
   Free-form parts (``dict[str, Any]``, ``Any``, models with ``extra="allow"``/``"ignore"``) are not walked for keys;
   a model with a ``before``/``wrap`` model validator (which may reshape its input) is not walked at all; a field's
   ``before`` validator is assumed to keep the keys of a dict it is given (it may narrow a union, as
   ``WorkloadConfig.model`` does).

What it costs: the raw scan, ~0.2 ms for a 125 kB window request; a larger body is parsed twice (here, then by the
route). What it does not bound: what a route does with a valid body (``make bench``, "request memory": peak RSS per
body byte for each service).
"""

from __future__ import annotations

import enum
import types
import typing
from collections import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import HTTPException
from fastapi.routing import APIRoute
from pydantic import AliasChoices, AliasPath, BaseModel, PydanticUserError, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import SchemaError, SchemaValidator
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.auth import Principal
from shared.errors import BadInput, format_loc, humanize
from shared.json_codec import loads as parse_json
from shared.settings import Settings

_NOT_AN_OBJECT = "Input should be a valid dictionary or object to extract fields from"  # pydantic's words
# A body within all three is not walked (`body_problem`): pydantic's own errors there are at most one a key, a value
# and a missing field (26 at most a request object here): ~64,000 (~100 MB as FastAPI holds them), and the window
# requests (~1,600 keys, ~600 arrays and objects, ~15,000 values) are not parsed twice.
_WALK_KEYS = 1 << 12
_WALK_CONTAINERS = 1 << 10
_FAIL_FAST_VALUES = 1 << 15  # past it the body is also validated fail-fast before the route validates it
_STRUCTURE = b'"[]{}:,'  # what the raw scan keeps of a body: quotes (to find the strings), brackets, colons, commas
_DROP = bytes(b for b in range(256) if b not in _STRUCTURE)
_STEP = np.zeros(256, dtype=np.int8)  # +1 for an opening bracket, -1 for a closing one
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_DEPTH_CHUNK = 1 << 22  # brackets per numpy pass (bounds the scan's own memory: ~20 MB)


@dataclass(frozen=True)
class JsonLimits:
    """The bounds of one JSON request body (``TASMOE_MAX_JSON_*``)."""

    max_depth: int
    max_keys: int
    max_values: int

    @classmethod
    def of(cls, settings: Settings) -> JsonLimits:
        return cls(settings.max_json_depth, settings.max_json_keys, settings.max_json_values)


@dataclass(frozen=True)
class Shape:
    """What the raw scan counted of a body's JSON structure."""

    keys: int
    containers: int  # arrays and objects
    values: int  # commas + arrays + objects + 1: every value, and one more for each empty array or object


class BodyRefused(BadInput, HTTPException):
    """A 422 in the standard error body, raised when the route reads the body. It is a `BadInput` first (the app's
    handler for it comes first in the class's MRO) and an `HTTPException` too, because FastAPI's request handler
    re-raises an `HTTPException` from the body read as it is, and answers any other exception there with a 400."""

    def __init__(self, message: str, field: str | None) -> None:
        Exception.__init__(self, message)  # the two bases' own __init__ do not chain
        self.message, self.field = message, field
        self.status_code, self.detail, self.headers = 422, message, None


def is_json(headers: Headers) -> bool:
    """The request's Content-Type is one FastAPI parses as JSON (``application/json``, ``application/*+json``)."""
    ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json"))


def _structure(body: bytes) -> bytes:
    """The brackets, colons and commas of a JSON text, those inside strings left out. Escaped backslashes and quotes
    are dropped first (JSON's escapes pair from the left, as ``bytes.replace`` does), so every quote left opens or
    closes a string, and what lies between an odd quote and the next is string content."""
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = body.translate(None, _DROP).replace(b'""', b"")  # strings without a bracket, colon or comma vanish here
    if b'"' in kept:
        kept = b"".join(kept.split(b'"')[::2])
    return kept


def _max_depth(brackets: bytes) -> int:
    """The deepest nesting of a sequence of brackets (numpy, a chunk at a time)."""
    deepest = level = 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        chunk = np.frombuffer(brackets, dtype=np.uint8, count=min(_DEPTH_CHUNK, len(brackets) - start), offset=start)
        levels = np.cumsum(_STEP[chunk], dtype=np.int64)
        deepest = max(deepest, level + int(levels.max()))
        level += int(levels[-1])
    return deepest


def check_raw(body: bytes, limits: JsonLimits) -> str | Shape:
    """Why ``body`` is refused before it is parsed (not UTF-8, too deep, too many keys or values), or its `Shape`.
    Brackets, colons and commas in strings do not count."""
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"request body is not valid UTF-8 (byte {exc.start})"
    kept = _structure(body)
    keys = kept.count(b":")
    if keys > limits.max_keys:
        return f"request body has {keys} object keys, over the limit of {limits.max_keys} (TASMOE_MAX_JSON_KEYS)"
    brackets = kept.translate(None, b":,")
    containers = brackets.count(b"[") + brackets.count(b"{")
    values = kept.count(b",") + containers + 1
    if values > limits.max_values:
        return f"request body has {values} values, over the limit of {limits.max_values} (TASMOE_MAX_JSON_VALUES)"
    if containers > limits.max_depth and _max_depth(brackets) > limits.max_depth:
        return f"request body is nested deeper than {limits.max_depth} arrays and objects (TASMOE_MAX_JSON_DEPTH)"
    return Shape(keys=keys, containers=containers, values=values)


# ------------------------------------------------------------------------------------------- the walk along a model
# A check takes a parsed JSON value and answers None (nothing to refuse) or (location, message), the location from
# the value down, in reverse (each level appends its own key on the way up: nothing is built on the happy path).
Problem = tuple[list[str | int], str]
Check = Callable[[Any], Problem | None]

_SCALARS: frozenset[Any] = frozenset({int, float, str, bool, bytes, type(None)})
_UNIONS: frozenset[Any] = frozenset({typing.Union, types.UnionType})
_SEQUENCES: frozenset[Any] = frozenset({list, set, frozenset, abc.Sequence, abc.Set, abc.MutableSequence})
_MAPPINGS: frozenset[Any] = frozenset({dict, abc.Mapping, abc.MutableMapping})
_BODY_CHECKS: dict[Any, Check | None] = {}
_MODEL_CHECKS: dict[type[BaseModel], Check | None] = {}
_BUILDING: set[type[BaseModel]] = set()


def body_check(annotation: Any) -> Check | None:
    """The check of a request body declared as ``annotation``, or None when nothing in it is walked; built once per
    type."""
    try:
        return _BODY_CHECKS[annotation]
    except KeyError:
        check = _BODY_CHECKS[annotation] = _build(annotation, None)
        return check
    except TypeError:  # an annotation with unhashable metadata: built each time
        return _build(annotation, None)


def _unwrap(tp: Any, discriminator: str | None = None) -> tuple[Any, str | None]:
    """``Annotated[X, ...]`` -> X, and the discriminator its metadata names (``Field(discriminator="kind")``)."""
    while typing.get_origin(tp) is typing.Annotated:
        tp, *meta = typing.get_args(tp)
        for m in meta:
            found = getattr(m, "discriminator", None)
            if isinstance(found, str):
                discriminator = found
    return tp, discriminator


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _reshapes(model: type[BaseModel]) -> bool:
    """The model has a ``before``/``wrap`` model validator: its input may have any shape."""
    return any(d.info.mode in ("before", "wrap") for d in model.__pydantic_decorators__.model_validators.values())


def _build(tp: Any, discriminator: str | None) -> Check | None:
    tp, discriminator = _unwrap(tp, discriminator)
    if _is_model(tp):
        return _model_check(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        return _union_check(args, discriminator)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return _tuple_check([_build(a, None) for a in args])
    if origin in _SEQUENCES or origin is tuple:
        return _walk_items(_item_check(args[0], discriminator)) if args else None
    if origin in _MAPPINGS and len(args) == 2:
        return _walk_values(_item_check(args[1], discriminator))
    return None


def _keys_of(name: str, field: FieldInfo) -> tuple[str, ...]:
    """Every key a field may be given under: its name and its aliases (more than pydantic may accept, never fewer:
    the guard refuses only what pydantic refuses too)."""
    keys = [name]
    if field.alias:
        keys.append(field.alias)
    va = field.validation_alias
    choices = va.choices if isinstance(va, AliasChoices) else [va] if va is not None else []
    for choice in choices:
        if isinstance(choice, str):
            keys.append(choice)
        elif isinstance(choice, AliasPath) and choice.path and isinstance(choice.path[0], str):
            keys.append(choice.path[0])
    return tuple(dict.fromkeys(keys))


def _model_check(model: type[BaseModel]) -> Check | None:
    """A model's keys (where it forbids unknown ones) and its fields' values, as far as they hold models."""
    if model in _MODEL_CHECKS:
        return _MODEL_CHECKS[model]
    if model in _BUILDING:  # a model that contains itself: its check is looked up when it runs
        def later(value: Any) -> Problem | None:
            check = _MODEL_CHECKS.get(model)
            return check(value) if check is not None else None
        return later
    if _reshapes(model):
        _MODEL_CHECKS[model] = None
        return None
    _BUILDING.add(model)
    try:
        opaque = {f for d in model.__pydantic_decorators__.field_validators.values()
                  if d.info.mode in ("plain", "wrap") for f in d.info.fields}
        keys = {name: _keys_of(name, field) for name, field in model.model_fields.items()}
        forbid = model.model_config.get("extra") == "forbid"
        allowed = frozenset(k for ks in keys.values() for k in ks)
        children: list[tuple[tuple[str, ...], Check]] = []
        for name, field in model.model_fields.items():
            if name in opaque or "*" in opaque:
                continue
            child = _build(field.annotation, field.discriminator if isinstance(field.discriminator, str) else None)
            if child is not None:
                children.append((keys[name], child))
    finally:
        _BUILDING.discard(model)
    if not forbid and not children:
        _MODEL_CHECKS[model] = None
        return None

    def check(value: Any) -> Problem | None:
        if type(value) is not dict:
            return None  # one value, one error of pydantic's (an item of a collection: `_item_check`)
        if forbid and not value.keys() <= allowed:
            return [next(k for k in value if k not in allowed)], "unknown key"
        for names, child in children:
            for name in names:
                v = value.get(name)
                if v is not None:
                    problem = child(v)
                    if problem is not None:
                        problem[0].append(name)
                        return problem
        return None

    _MODEL_CHECKS[model] = check
    return check


def _item_check(tp: Any, discriminator: str | None) -> Check | None:
    """The check of one item of a list, tuple, set or dict. Where the item is a model (or one of a union of models),
    it must also be an object with the model's required fields: pydantic's errors there are one per item (or per
    missing field of each), so 9 MB of ``0,`` where objects belong made 4.7 million of them."""
    inner, discriminator = _unwrap(tp, discriminator)
    if _is_model(inner):
        return _object_item(inner)
    members = [_unwrap(m)[0] for m in typing.get_args(inner)] if typing.get_origin(inner) in _UNIONS else []
    if not members or not all(_is_model(m) for m in members):
        return _build(inner, discriminator)
    tagged: dict[Any, Check | None] = {}
    for m in members:
        tag_type = _unwrap(m.model_fields[discriminator].annotation)[0] \
            if discriminator is not None and discriminator in m.model_fields else None
        if typing.get_origin(tag_type) is typing.Literal:
            tagged.update({tag: _tagged(_object_item(m), tag) for tag in typing.get_args(tag_type)})

    def check(value: Any) -> Problem | None:
        if type(value) is not dict:
            return [], _NOT_AN_OBJECT
        tag = value.get(discriminator) if discriminator is not None else None
        c = tagged.get(tag) if isinstance(tag, (str, int, bool)) else None
        return c(value) if c is not None else None  # no tag, or an unknown one: pydantic's one error

    return check


def _object_item(model: type[BaseModel]) -> Check | None:
    """An item that must be a ``model``: an object with its required fields, then the model's own check."""
    walk = _model_check(model)
    if _reshapes(model):
        return walk
    required = [_keys_of(name, f) for name, f in model.model_fields.items() if f.is_required()]
    simple = frozenset(ks[0] for ks in required if len(ks) == 1)
    aliased = [ks for ks in required if len(ks) > 1]

    def check(value: Any) -> Problem | None:
        if type(value) is not dict:
            return [], _NOT_AN_OBJECT
        if not simple <= value.keys():
            return [next(ks[0] for ks in required if len(ks) == 1 and ks[0] not in value)], "required"
        for ks in aliased:
            if not any(k in value for k in ks):
                return [ks[0]], "required"
        return walk(value) if walk is not None else None

    return check


def _tagged(check: Check | None, tag: Any) -> Check | None:
    """A discriminated union member's check: pydantic names the member by its tag in the location
    (``ops[0].matmul.M``)."""
    if check is None:
        return None

    def tagged(value: Any) -> Problem | None:
        problem = check(value)
        if problem is not None:
            problem[0].append(str(tag))
        return problem

    return tagged


def _walk_items(item: Check | None) -> Check | None:
    if item is None:
        return None

    def check(value: Any) -> Problem | None:
        if type(value) is not list:
            return None
        for i, v in enumerate(value):
            problem = item(v)
            if problem is not None:
                problem[0].append(i)
                return problem
        return None

    return check


def _walk_values(item: Check | None) -> Check | None:
    if item is None:
        return None

    def check(value: Any) -> Problem | None:
        if type(value) is not dict:
            return None
        for k, v in value.items():
            problem = item(v)
            if problem is not None:
                problem[0].append(k)
                return problem
        return None

    return check


def _tuple_check(items: list[Check | None]) -> Check | None:
    if all(c is None for c in items):
        return None

    def check(value: Any) -> Problem | None:
        if type(value) is not list:
            return None
        for i, (c, v) in enumerate(zip(items, value, strict=False)):
            problem = c(v) if c is not None else None
            if problem is not None:
                problem[0].append(i)
                return problem
        return None

    return check


def _union_check(members: tuple[Any, ...], discriminator: str | None) -> Check | None:
    """A union is walked where the value's JSON kind leaves one member to walk (``str | ArchConfig`` given an
    object), or where a discriminated union's tag names one; otherwise pydantic alone decides."""
    plain = [_unwrap(m)[0] for m in members]

    def is_array(tp: Any) -> bool:
        return typing.get_origin(tp) in _SEQUENCES or typing.get_origin(tp) is tuple

    objects = [m for m in plain if m not in _SCALARS and typing.get_origin(m) is not typing.Literal
               and not is_array(m) and not (isinstance(m, type) and issubclass(m, enum.Enum))]
    arrays = [m for m in plain if is_array(m)]
    for_object = _build(objects[0], None) if len(objects) == 1 else None
    for_array = _build(arrays[0], None) if len(arrays) == 1 else None
    tagged: dict[Any, Check | None] = {}
    if discriminator is not None:
        for m in objects:
            if _is_model(m) and discriminator in m.model_fields:
                tag_type = _unwrap(m.model_fields[discriminator].annotation)[0]
                c = _model_check(m)
                if c is not None and typing.get_origin(tag_type) is typing.Literal:
                    tagged.update({tag: _tagged(c, tag) for tag in typing.get_args(tag_type)})
    if for_object is None and for_array is None and not tagged:
        return None

    def check(value: Any) -> Problem | None:
        if type(value) is dict:
            if discriminator is not None:
                tag = value.get(discriminator)
                c = tagged.get(tag) if isinstance(tag, (str, int, bool)) else None
                return c(value) if c is not None else None
            return for_object(value) if for_object is not None else None
        if type(value) is list and for_array is not None:
            return for_array(value)
        return None

    return check


# ------------------------------------------------------------------------------------------ fail-fast validation
_COLLECTIONS = frozenset({"list", "tuple", "set", "frozenset", "dict", "deque"})
_FAIL_FAST_VALIDATORS: dict[Any, SchemaValidator | None] = {}


def _fail_fast_schema(node: Any) -> Any:
    """A copy of a pydantic core schema in which every list, tuple, set and dict stops at its first error."""
    if isinstance(node, dict):
        out = {k: _fail_fast_schema(v) for k, v in node.items()}
        if isinstance(out.get("type"), str) and out["type"] in _COLLECTIONS:
            out["fail_fast"] = True
        return out
    if isinstance(node, list):
        return [_fail_fast_schema(v) for v in node]
    return node


def fail_fast_validator(annotation: Any) -> SchemaValidator | None:
    """The validator of ``annotation`` (pydantic's own schema, as FastAPI builds it) with every collection
    fail-fast: its errors are at most one a collection, where the route's validator makes one for each wrong value
    (millions, in a body of millions of values: ~1.5 kB each once FastAPI has them as dicts). Built once per type;
    None where pydantic builds no schema for the type."""
    try:
        return _FAIL_FAST_VALIDATORS[annotation]
    except KeyError:
        pass
    except TypeError:  # unhashable metadata: not kept
        return None
    try:
        validator: SchemaValidator | None = SchemaValidator(_fail_fast_schema(TypeAdapter(annotation).core_schema))
    except (PydanticUserError, SchemaError):
        validator = None
    _FAIL_FAST_VALIDATORS[annotation] = validator
    return validator


# ------------------------------------------------------------------------------------------------------ the middleware
def body_problem(route: object, body: bytes, shape: Shape) -> tuple[str, str | None] | None:
    """(message, field) of what is wrong in ``body`` for the request model of ``route`` (the route FastAPI chose), or
    None: the walk (`body_check`) of a body of more than 4,096 keys, 1,024 arrays and objects or 32,768 values, and
    past 32,768 values the fail-fast validation (`fail_fast_validator`). The body is parsed with orjson for them and
    dropped after."""
    if shape.keys <= _WALK_KEYS and shape.containers <= _WALK_CONTAINERS and shape.values <= _FAIL_FAST_VALUES:
        return None
    if not isinstance(route, APIRoute) or not route.dependant.body_params:
        return None
    params = route.dependant.body_params
    embedded = len(params) > 1 or bool(getattr(params[0].field_info, "embed", False))
    checks = [(p.alias, body_check(p.field_info.annotation)) for p in params]
    validator = fail_fast_validator(params[0].field_info.annotation) \
        if shape.values > _FAIL_FAST_VALUES and not embedded else None
    if validator is None and all(c is None for _, c in checks):
        return None
    try:
        value = parse_json(body)  # orjson; the standard library for NaN tokens, which FastAPI's parser reads
    except ValueError:
        return None  # FastAPI answers invalid JSON itself (422, "request body is not valid JSON: ...")
    for alias, check in checks:
        part = value.get(alias) if embedded and type(value) is dict else None if embedded else value
        problem = check(part) if check is not None and part is not None else None
        if problem is not None:
            loc, message = problem
            field = format_loc([*([alias] if embedded else []), *reversed(loc)])
            return (f"{field}: {message}" if field else message), field or None
    if validator is not None:
        try:
            validator.validate_python(value)
        except ValidationError as exc:
            err = exc.errors(include_url=False, include_input=False)[0]
            field = format_loc(err["loc"])
            message = humanize(err)
            return (f"{field}: {message}" if field else message), field or None
    return None


class JsonBodyGuard:
    """ASGI middleware: reads a JSON request body whole (its size is bounded by the middleware outside it,
    ``TASMOE_MAX_BODY_MB``), refuses it with 422 when `check_raw` finds it over a bound, and otherwise hands it to
    the app, checking it along the chosen route's request model (`body_problem`) when the route reads it.

    The check along the model is skipped for an admin caller (``shared.auth``: the services' own key, an operator's
    key, and every caller of a server without keys, TASMOE_AUTH=off, which is the laptop's and the embedded runs'
    mode): the services' control-epoch requests hold millions of values, and parsing them twice cost a run more than
    its physicalizer. The raw bounds hold for every caller."""

    def __init__(self, app: ASGIApp, limits: JsonLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_json(Headers(scope=scope)):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body was complete: nobody to answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        pending: bytes | None = b"".join(chunks)
        chunks.clear()
        shape = check_raw(pending, self.limits) if pending else Shape(keys=0, containers=0, values=0)
        if isinstance(shape, str):
            content = {"error": {"code": BadInput.code, "message": shape, "field": "body"}}
            await JSONResponse(status_code=BadInput.status, content=content)(scope, receive, send)
            return

        async def replay() -> Message:
            nonlocal pending
            if pending is None:
                return await receive()
            body, pending = pending, None
            trusted = isinstance(principal := scope.get("state", {}).get("principal"), Principal) and principal.admin
            refused = body_problem(scope.get("route"), body, shape) if body and not trusted else None
            if refused is not None:
                raise BodyRefused(*refused)
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
