"""Run data named by content (``shared.content``, issue 21 item 3): the hash rule, the bounded store, the errors."""

from __future__ import annotations

import hashlib

import pytest

from shared.configs import ArchConfig
from shared.configs.tas import TacsParams
from shared.content import ContentStore, canonical_json, content_hash, object_or_hash
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
