"""Where the chunks of a run are computed: in this process, or on Ray actors that each hold their own copy of the
models, on one machine or across a cluster.

    pool = parallel.make_pool(workers=2, address=None)           # Ray (a local cluster when no address)
    for index, rows in pool.map(lambda part: probes.deploy(model, task, part, "native"), parts):
        store.append("deployed", rows)                              # the one writer: the driver

A chunk function may close over any ``HookedTransformer`` (and its engine): it travels to the actors without the
weights, and each actor runs it on its own copy of that model, shipped once through Ray's object store and moved
to the actor's GPU when it has one. Rows come back to the driver as chunks finish, in any order; the driver
appends them to the run store, so resume, de-duplication and the protocol check work as in one process. A chunk
whose actor dies is given to a fresh actor: nothing is lost and nothing is written twice. Results equal the
single-process run's: every chunk is computed exactly as it would be locally (same questions, same seeds).

Every machine of a cluster needs the same reach_lens (and torch, transformer-lens) installed and, for the
embedded defaults, nothing else: the models come from the driver.
"""

from __future__ import annotations

import io
import os
import pickle
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from transformer_lens import HookedTransformer

from reach_lens.generate import TransformerLensEngine, engine_for

Chunk = Callable[[Any], list]


class LocalPool:
    """Chunks computed one after another in this process."""

    workers = 1

    def map(self, fn: Chunk, parts: Sequence[Any]) -> Iterator[tuple[int, list]]:
        for index, part in enumerate(parts):
            yield index, fn(part)

    def close(self) -> None:
        pass


def dumps(fn: Chunk, register: Callable[[HookedTransformer], str]) -> bytes:
    """``fn`` pickled by value (``ray.cloudpickle``), every HookedTransformer or TransformerLens engine it reaches
    replaced by the key ``register`` gives its model (the weights travel once, separately)."""
    from ray import cloudpickle

    class ModelPickler(cloudpickle.Pickler):
        def persistent_id(self, obj: Any):
            if isinstance(obj, HookedTransformer):
                return ("model", register(obj))
            if isinstance(obj, TransformerLensEngine):
                return ("engine", register(obj.model))
            return None

    buffer = io.BytesIO()
    ModelPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(fn)
    return buffer.getvalue()


def loads(payload: bytes, model_of: Callable[[str], HookedTransformer]) -> Chunk:
    """The inverse of ``dumps``: keys become ``model_of(key)`` (or that model's engine)."""

    class ModelUnpickler(pickle.Unpickler):
        def persistent_load(self, pid):
            kind, key = pid
            model = model_of(key)
            return model if kind == "model" else engine_for(model)

    return ModelUnpickler(io.BytesIO(payload)).load()


def _worker_class():
    import ray

    @ray.remote
    class Worker:
        """Holds models by key and runs chunk functions on them."""

        def __init__(self, threads: int | None):
            if threads:
                torch.set_num_threads(threads)
            self.models: dict[str, HookedTransformer] = {}
            self.device = "cuda" if ray.get_gpu_ids() else "cpu"

        def run(self, payload: bytes, refs: dict[str, Any], part: Any) -> list:
            for key in [k for k in self.models if k not in refs]:  # models the driver has let go of
                del self.models[key]

            def model_of(key: str) -> HookedTransformer:
                if key not in self.models:
                    model = ray.get(refs[key])
                    self.models[key] = model.to(self.device) if self.device != "cpu" else model
                return self.models[key]

            return loads(payload, model_of)(part)

        def pid(self) -> int:
            return os.getpid()

    return Worker


class RayPool:
    """Chunks computed by ``workers`` Ray actors (one GPU each when the cluster has GPUs, else
    ``threads_per_worker`` CPU threads each)."""

    def __init__(self, workers: int, address: str | None = None, threads_per_worker: int | None = None):
        import ray

        if workers < 1:
            raise ValueError(f"workers {workers} out of range: expected >= 1")
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        gpus = int(ray.cluster_resources().get("GPU", 0))
        self.workers = workers
        self.threads = threads_per_worker or max(1, int(ray.cluster_resources().get("CPU", 1)) // workers)
        self.options = {"num_gpus": 1, "num_cpus": 1} if gpus >= workers else {"num_cpus": self.threads}
        free = ray.available_resources()
        for resource, need in (("GPU", self.options.get("num_gpus", 0)), ("CPU", self.options["num_cpus"])):
            if need and free.get(resource, 0) < need * workers:
                raise ValueError(f"{workers} workers need {need * workers:g} free {resource}s; the Ray cluster has "
                                 f"{free.get(resource, 0):g} free (of {ray.cluster_resources().get(resource, 0):g}): "
                                 "ask for fewer --workers, fewer --threads, or stop the other actors")
        self.actors = [self._new_actor() for _ in range(workers)]
        self.refs: dict[str, Any] = {}
        self.keys: dict[int, str] = {}  # id of a live model -> its key (dropped when the model is collected)
        self.registered = 0

    def _new_actor(self):
        return _worker_class().options(**self.options).remote(None if "num_gpus" in self.options else self.threads)

    def _register(self, model: HookedTransformer) -> str:
        """The key of ``model``'s copy in the object store, shipped on first use. Keys are never reused: when the
        model is collected its entry goes (a later model at the same address is another model)."""
        import ray

        key = self.keys.get(id(model))
        if key is None:
            key = self.keys[id(model)] = f"m{self.registered}"
            self.registered += 1
            self.refs[key] = ray.put(model)
            weakref.finalize(model, self._forget, id(model), key)
        return key

    def _forget(self, model_id: int, key: str) -> None:
        if self.keys.get(model_id) == key:
            del self.keys[model_id]
        self.refs.pop(key, None)

    def map(self, fn: Chunk, parts: Sequence[Any]) -> Iterator[tuple[int, list]]:
        """Yield (part index, rows) as parts finish; a part whose actor died is run again on a fresh actor."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        payload = ray.put(dumps(fn, self._register))
        todo = list(range(len(parts)))[::-1]
        running: dict[Any, tuple[int, int]] = {}  # object ref -> (part index, actor slot)
        idle = list(range(len(self.actors)))
        while todo or running:
            while todo and idle:
                slot = idle.pop()
                index = todo.pop()
                running[self.actors[slot].run.remote(payload, self.refs, parts[index])] = (index, slot)
            done, _ = ray.wait(list(running), num_returns=1)
            index, slot = running.pop(done[0])
            try:
                rows = ray.get(done[0])
            except (RayActorError, ActorDiedError, ActorUnavailableError):
                self.actors[slot] = self._new_actor()
                todo.append(index)
                idle.append(slot)
                continue
            idle.append(slot)
            yield index, rows

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def make_pool(workers: int = 1, address: str | None = None, threads_per_worker: int | None = None):
    """A ``RayPool`` when ``address`` is given (``"local"``: a local cluster) or ``workers > 1``, else a
    ``LocalPool``."""
    if address is None and workers <= 1:
        return LocalPool()
    return RayPool(workers, None if address in (None, "local") else address, threads_per_worker)
