"""Run data named by content (``shared.content``, issue 21 item 3): the hash rule, the bounded store, the errors."""

from __future__ import annotations

import base64
import hashlib

import numpy as np
import pytest
from pydantic import BaseModel

from shared import content as content_module
from shared.configs import ArchConfig
from shared.configs.tas import TacsParams
from shared.content import (
    ContentStore,
    canonical_json,
    content_hash,
    field_order_json,
    field_order_json_orjson,
    object_or_hash,
    state_store,
)
from shared.contracts.events import PhysicalState
from shared.contracts.placement import ReplicaState
from shared.contracts.thermal import ThermalState
from shared.errors import BadInput, NotFound


def _params(alpha: float) -> TacsParams:
    return TacsParams.model_validate({"q_target": alpha})


def test_the_hash_is_sha256_of_the_canonical_json() -> None:
    arch = ArchConfig()
    assert content_hash(arch) == hashlib.sha256(canonical_json(arch).encode()).hexdigest()
    assert content_hash(arch) == arch.content_hash(64)  # the configs' own rule, in full
    assert content_hash(arch).startswith(arch.content_hash())  # the thermal model's name is its prefix
    assert content_hash(_params(0.5)) != content_hash(_params(0.25))


def test_the_store_is_an_lru_bounded_by_its_capacity() -> None:
    store: ContentStore[TacsParams] = ContentStore("tacs_params", 2, field="params_hash", path="/v1/registry/x")
    keys = [store.put(_params(a))[0] for a in (0.1, 0.2)]
    assert store.put(_params(0.1))[0] == keys[0] and len(store) == 2  # known: kept once, now the newest
    k3, size = store.put(_params(0.3))
    assert size == len(canonical_json(_params(0.3)))
    assert keys[0] in store and k3 in store and keys[1] not in store  # the least recently used went
    assert store.get(keys[0]) == _params(0.1)
    with pytest.raises(NotFound) as exc:
        store.get(keys[1])
    assert exc.value.code == "unknown_tacs_params" and exc.value.field == "params_hash"
    assert "/v1/registry/x" in exc.value.message
    store.clear()
    assert len(store) == 0
    with pytest.raises(ValueError):
        ContentStore("x", 0, field="x_hash", path="/")


def test_keep_puts_an_object_back_under_its_name_and_refreshes_it() -> None:
    store: ContentStore[TacsParams] = ContentStore("tacs_params", 2, field="params_hash", path="/v1/registry/x")
    k1, _ = store.put(_params(0.1))
    k2, _ = store.put(_params(0.2))
    store.keep(k1, store.get(k1))  # answered again unchanged: now the newest
    store.put(_params(0.3))
    assert k1 in store and k2 not in store
    obj = _params(0.2)
    store.keep(k2, obj)  # gone meanwhile: kept again under the name put gave it
    assert store.get(k2) is obj and store.put(obj)[0] == k2


def test_object_or_hash_wants_exactly_one() -> None:
    store: ContentStore[TacsParams] = ContentStore("tacs_params", 4, field="params_hash", path="/v1/registry/x")
    key, _ = store.put(_params(0.4))
    assert object_or_hash(None, key, store, field="params") == _params(0.4)
    assert object_or_hash(_params(0.2), None, store, field="params") == _params(0.2)
    assert object_or_hash(None, None, store, field="params", default=_params(0.9)) == _params(0.9)
    for obj, k in ((_params(0.2), key), (None, None)):
        with pytest.raises(BadInput) as bad:
            object_or_hash(obj, k, store, field="params")
        assert bad.value.field == "params" and "params_hash" in bad.value.message


def _thermal_state(rng: np.random.Generator) -> ThermalState:
    field = (300.0 + 60.0 * rng.random(20_000)).astype("<f4")
    energy = np.array([0.0, 1 / 3, 1e-300, 5e-324, 1e300, 2.0**-1074, 0.1 + 0.2])
    return ThermalState(t_ns=123_456_789_012, field_b64=base64.b64encode(field.tobytes()).decode(),
                        dvfs_level=list(rng.integers(0, 4, 64)), window=41,
                        warm_energy_b64=base64.b64encode(energy.tobytes()).decode(), warm_s=1 / 3)


def test_a_states_name_is_the_same_through_orjson_and_pydantic() -> None:
    """The thermal state's name is written by orjson (`state_store(long_strings=True)`) and must be the text
    pydantic writes in field order: a state named by one replica is found by the name another computes, and a replay
    checks the name it reproduced. Checked on thermal states (ambient, warm, edge floats) and on the other states'
    shapes: nested models, dicts, None, escapes, non-ASCII, extreme floats."""
    rng = np.random.default_rng(7)
    states: list[BaseModel] = [ThermalState(), _thermal_state(rng), ThermalState(warm_s=1e300, window=-1)]
    replicas = ReplicaState.model_validate({"experts": {
        f"L{i}.E{j}": {"cores": [i, j], "ts_created_ns": i * j, "last_change_ns": None if j else 5,
                       "prev_cores": [j] if j % 2 else None, "shard_banks": ["c1.v0.l0.b1", "ü\"\\\n\t\x01\x7f"]}
        for i in range(3) for j in range(4)}})
    states += [replicas, PhysicalState(replicas=replicas, next_evt_id=2**62,
                                       tensor_banks={"w.é": "b", "": "\u2028"})]
    for st in states:
        assert field_order_json_orjson(st) == field_order_json(st) == st.model_dump_json().encode()
    store: ContentStore[ThermalState] = state_store("thermal_state", 4, long_strings=True)
    plain: ContentStore[ThermalState] = state_store("thermal_state", 4)
    st = _thermal_state(rng)
    assert store.put(st) == plain.put(st)


def test_a_kept_part_is_named_by_its_digest_and_not_written_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The physical state names its replica state (carried unchanged from window to window) by the part's digest:
    the same content gives the same name whether or not the part is the object seen before; other content, another
    name; the part is written once while it stays the same object."""
    def replicas(cores: list[int]) -> ReplicaState:
        return ReplicaState.model_validate({"experts": {"L0.E0": {"cores": cores}, "L1.E3": {"cores": [5]}}})

    store: ContentStore[PhysicalState] = state_store("physical_state", 4, kept_parts=("replicas",))
    r = replicas([1, 2])
    a = PhysicalState(replicas=r, next_evt_id=3)
    key_a, _ = store.put(a)
    written: list[str] = []
    dump = content_module.field_order_json

    def counted(obj: BaseModel) -> bytes:
        written.append(type(obj).__name__)
        return dump(obj)

    monkeypatch.setattr(content_module, "field_order_json", counted)
    assert store.put(PhysicalState(replicas=r, next_evt_id=3))[0] == key_a  # the part seen before: not written
    assert written == []
    assert store.put(PhysicalState(replicas=replicas([1, 2]), next_evt_id=3))[0] == key_a  # equal, not the same
    assert written == ["ReplicaState"]
    assert store.put(PhysicalState(replicas=replicas([1, 3]), next_evt_id=3))[0] != key_a
    assert store.put(PhysicalState(replicas=r, next_evt_id=4))[0] != key_a
    text = store.key_json(a)
    assert isinstance(text, bytes) and text.startswith(a.model_dump_json(exclude={"replicas"}).encode())
    assert text.endswith(f"\nreplicas={hashlib.sha256(r.model_dump_json().encode()).hexdigest()}".encode())
    assert store.get(key_a) is a
