"""`ESAgent`: EvoKit's workflow in Python: perturb, evaluate, report names and rewards, update.

```python
agent = ESAgent(ESConfig.from_file("es.toml"), model=policy_net)  # or a numpy vector + policy
sampler = agent.clone()                        # shares the solver, has its own weights and keys
infos, rewards = [], []
for _ in range(agent.population_size):
    infos.append(sampler.add_noise())          # perturbs the sampler's weights, names the noise
    rewards.append(evaluate(sampler.predict))  # sampler.predict(obs) acts with those weights
agent.update(infos, rewards)                   # regenerates each noise vector from its name
```

Only `SamplingInfo`s and rewards ever need to travel: a remote sampler is an `ESAgent` built
from the same config and weights (`sampler_id` keeps its keys apart from the others), and it
stays in step with the learner either by being sent the new weights or by applying the same
`update(infos, rewards)` itself: replicas told the same samples compute the same parameters.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from parl_evo._cma import CMAES, SepCMAES
from parl_evo._config import ESConfig
from parl_evo._es import GaussianES
from parl_evo._exceptions import SolverStateError
from parl_evo._ga import GA
from parl_evo._log import SampleLogWriter, read_sample_log
from parl_evo._noise import NoiseSource, NoiseTable, SamplingInfo, SeedNoise
from parl_evo._optimizers import SGD, Adam, Momentum, Optimizer
from parl_evo._params import ModuleParams, Policy, VectorParams, is_torch_module, make_params
from parl_evo._solver import Solver, UpdateStats
from parl_evo._state import load_state, save_state

__all__ = ["ESAgent", "make_optimizer", "make_solver"]

_SOLVER_FORMAT = "parl_evo.solver/1"


def make_optimizer(config: ESConfig) -> Optimizer:
    """The optimizer that `config.optimizer` describes."""
    opt = config.optimizer
    if opt.type == "SGD":
        return SGD(lr=opt.base_lr)
    if opt.type == "MOMENTUM":
        return Momentum(lr=opt.base_lr, momentum=opt.momentum)
    return Adam(lr=opt.base_lr, beta1=opt.beta1, beta2=opt.beta2, epsilon=opt.epsilon)


def make_solver(config: ESConfig, x0: np.ndarray, noise: NoiseSource) -> Solver:
    """The solver that `config.solver` describes, centered at `x0`, drawing from `noise`."""
    kind = config.solver.type
    common: dict[str, Any] = {
        "x0": x0,
        "sigma": config.gaussian_sampling.std,
        "noise": noise,
        "population_size": config.solver.population_size,
    }
    if kind == "BASIC_ES":
        return GaussianES(
            **common,
            optimizer=make_optimizer(config),
            mirrored=config.gaussian_sampling.mirrored,
            weight_decay=config.solver.weight_decay,
            max_staleness=config.async_es.max_staleness,
            staleness_decay=config.async_es.staleness_decay,
        )
    if kind == "CMA_ES":
        return CMAES(**common)
    if kind == "SEP_CMA_ES":
        return SepCMAES(**common)
    return GA(**common, parents=config.solver.parents, elites=config.solver.elites)


class ESAgent:
    """An evolution-strategies agent: EvoKit's `ESAgent`, numpy first, torch models welcome.

    Args:
        config: an `ESConfig`, a mapping of its sections, or the path of a TOML/YAML file.
        model: the weights to search over: a numpy vector (acted on by `policy`) or a torch
            `nn.Module` (its parameters, flattened). May be given later with `load_weights`.
        policy: for a numpy vector, `policy(weights, obs) -> action`, used by `predict`.
        sampler_id: tells apart samplers built from the same config in different processes:
            each id draws its own keys (give every remote sampler a different one).
        noise_directory: where a cached noise table's file lives (default: `/dev/shm` or the
            temp dir).
    """

    def __init__(
        self,
        config: ESConfig | Mapping[str, Any] | str | os.PathLike[str],
        *,
        model: Any = None,
        policy: Policy | None = None,
        sampler_id: int = 0,
        noise_directory: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(config, ESConfig):
            self.config = config
        elif isinstance(config, Mapping):
            self.config = ESConfig.from_dict(config)
        else:
            self.config = ESConfig.from_file(config)
        if sampler_id < 0:
            raise ValueError(f"ESAgent: {sampler_id=} must be >= 0")
        self.sampler_id = int(sampler_id)
        sampling = self.config.gaussian_sampling
        self.noise: NoiseSource = (
            NoiseTable(seed=self.config.seed, size=sampling.cache_size, directory=noise_directory)
            if sampling.cached
            else SeedNoise()
        )
        self._seed_sequence = np.random.SeedSequence(self.config.seed, spawn_key=(sampler_id,))
        self._rng = np.random.Generator(np.random.PCG64(self._seed_sequence))
        self._pending: SamplingInfo | None = None  # the mirrored twin of the last fresh noise
        self._params: VectorParams | ModuleParams | None = None
        self._policy = policy
        self._solver: Solver | None = None
        self._owns_solver = True
        if model is not None:
            self.load_weights(model)

    # -- weights -------------------------------------------------------------------------------
    def load_weights(self, weights: Any) -> None:
        """Start the search from `weights`: a numpy vector or a torch `nn.Module`.

        The first call (or `model=` in the constructor) also decides what the agent acts with:
        a module is used in place; a vector with the agent's `policy`. Later calls take a flat
        vector or a module of the same architecture. The solver restarts at version 0, centered
        at the new weights (load a saved solver afterwards with `load_solver`); clones made
        before keep sampling around the old solver, so clone again.
        """
        if not self._owns_solver:
            raise SolverStateError(
                "a cloned sampling agent takes its weights from the agent it was cloned from; "
                "call load_weights on that agent"
            )
        if self._params is None:
            self._params = make_params(weights, self._policy)
        elif is_torch_module(weights):
            self._params.set(self._check_dim(ModuleParams(weights).get()))
        else:
            self._params.set(self._check_dim(np.asarray(weights, dtype=np.float64).ravel()))
        self._solver = make_solver(self.config, self._params.get(), self.noise)
        self._pending = None

    def get_weights(self) -> np.ndarray:
        """The solver's current solution (the unperturbed weights) as a flat float64 vector."""
        return self.solver.mean

    @property
    def weights(self) -> np.ndarray:
        """The flat vector this agent acts with now (perturbed after `add_noise`)."""
        return self._require_params().get()

    @property
    def model(self) -> Any:
        """The torch module or numpy vector this agent acts with."""
        params = self._require_params()
        return params.module if isinstance(params, ModuleParams) else params.weights

    @property
    def solver(self) -> Solver:
        """The solver (shared with clones)."""
        if self._solver is None:
            raise SolverStateError(
                "this ESAgent has no weights yet: pass model= to ESAgent(...) or call "
                "load_weights(weights) first"
            )
        return self._solver

    @property
    def population_size(self) -> int:
        """Candidates per generation, as the solver would ask for them."""
        return self.solver.population_size

    # -- EvoKit's workflow ---------------------------------------------------------------------
    def clone(self) -> ESAgent:
        """A sampling agent: shares this agent's solver, has its own weights and key stream.

        Clones are for sampling (`add_noise`, `predict`); only the original updates. The n-th
        clone of an agent always draws the same keys, so runs are reproducible.
        """
        solver = self.solver
        clone = object.__new__(type(self))
        clone.config = self.config
        clone.sampler_id = self.sampler_id
        clone.noise = self.noise
        clone._seed_sequence = self._seed_sequence.spawn(1)[0]
        clone._rng = np.random.Generator(np.random.PCG64(clone._seed_sequence))
        clone._pending = None
        clone._params = self._require_params().copy()
        clone._params.set(solver.mean)
        clone._policy = self._policy
        clone._solver = solver
        clone._owns_solver = False
        return clone

    def add_noise(self) -> SamplingInfo:
        """Perturb this agent's weights around the solver's current version; name the noise.

        With mirrored sampling (BASIC_ES's default) calls alternate: a fresh noise vector, then
        the same vector negated. A pending twin is dropped if the solver moved on meanwhile.
        """
        solver = self.solver
        info, self._pending = self._pending, None
        if info is None or info.version != solver.version:
            info = SamplingInfo(solver.noise.draw_key(self._rng, solver.dim), 1, solver.version)
            if solver.mirrored:
                self._pending = info.mirrored()
        self._require_params().set(solver.candidate(info))
        return info

    def predict(self, obs: Any) -> Any:
        """The model's output for `obs` with the current (perhaps perturbed) weights."""
        return self._require_params().predict(obs)

    def update(self, sampling_infos: Sequence[SamplingInfo], rewards: ArrayLike) -> UpdateStats:
        """Update the solver from evaluated samples; the agent then acts with the new solution.

        Samples of older versions are used or discarded as the solver's rule says (BASIC_ES:
        `async_es.max_staleness`; the others: current version only).
        """
        if not self._owns_solver:
            raise SolverStateError(
                "a cloned sampling agent cannot update; call update on the agent it was cloned "
                "from (its clones see the new solution at their next add_noise)"
            )
        stats = self.solver.tell(list(sampling_infos), rewards)
        self._require_params().set(self.solver.mean)
        self._pending = None
        return stats

    # -- solver files --------------------------------------------------------------------------
    def save_solver(self, path: str | os.PathLike[str]) -> None:
        """Save all solver and optimizer state, and this agent's key stream, atomically.

        An agent that loads the file continues exactly as this one would have: the same keys,
        the same updates, bit for bit.
        """
        solver = self.solver
        pending = None if self._pending is None else list(_info_fields(self._pending))
        save_state(
            path,
            {
                "format": _SOLVER_FORMAT,
                "type": solver.type_name,
                "dim": solver.dim,
                "noise": self.noise.describe(),
                "solver": solver.state_dict(),
                "sampler": {
                    "rng": self._rng.bit_generator.state,
                    "pending": pending,
                    "clones": self._seed_sequence.n_children_spawned,
                },
            },
        )

    def load_solver(self, path: str | os.PathLike[str]) -> None:
        """Load a file written by `save_solver` (same solver type, noise and parameter count).

        Raises:
            SolverStateError: the file does not fit this agent; the message says why.
        """
        if not self._owns_solver:
            raise SolverStateError("a cloned sampling agent cannot load a solver; use its origin")
        solver = self.solver
        path = os.fspath(path)
        state = load_state(path)
        if state.get("format") != _SOLVER_FORMAT:
            raise SolverStateError(f"{path!r} is not a solver file written by save_solver")
        checks = (
            ("type", state["type"], solver.type_name, "solver.type"),
            ("dim", state["dim"], solver.dim, "the model"),
            ("noise", state["noise"], self.noise.describe(), "gaussian_sampling"),
        )
        for name, saved, here, fix in checks:
            if saved != here:
                raise SolverStateError(
                    f"{path!r} holds a solver with {name}={saved!r}, this agent has "
                    f"{name}={here!r}; make {fix} match the run that saved it"
                )
        solver.load_state_dict(state["solver"])
        sampler = state["sampler"]
        self._rng.bit_generator.state = sampler["rng"]
        pending = sampler["pending"]
        self._pending = None if pending is None else SamplingInfo(*pending)
        self._seed_sequence = np.random.SeedSequence(
            self.config.seed,
            spawn_key=(self.sampler_id,),
            n_children_spawned=int(sampler["clones"]),
        )
        self._require_params().set(solver.mean)

    # -- online sampling, offline update -------------------------------------------------------
    def log_meta(self) -> dict[str, Any]:
        """The metadata this agent writes into (and expects from) a sample log."""
        solver = self.solver
        return {"dim": solver.dim, "noise": self.noise.describe(), "solver": solver.type_name}

    def open_log(self, path: str | os.PathLike[str]) -> SampleLogWriter:
        """Open a sample log to append `(info, reward)` records to (many samplers may share it)."""
        return SampleLogWriter(path, meta=self.log_meta())

    def update_from_log(
        self, path: str | os.PathLike[str], *, start: int = 0
    ) -> tuple[UpdateStats, int]:
        """`update` from the records of a sample log, from byte `start` on.

        Returns:
            The update's stats, and the byte offset to pass as `start` next time (so that the
            next update reads only records appended since).

        Raises:
            SampleLogError: the log is damaged, or was written for another model or noise.
        """
        batch = read_sample_log(path, start=start)
        meta = self.log_meta()
        if batch.meta != meta:
            raise SolverStateError(
                f"{os.fspath(path)}: the log was written with {batch.meta}, this agent has "
                f"{meta}; update from a log written by samplers of this configuration"
            )
        return self.update(batch.infos, batch.rewards), batch.end

    def close(self) -> None:
        """Release the noise table's mapping, which clones share (the file stays for others)."""
        if isinstance(self.noise, NoiseTable):
            self.noise.close()

    def __enter__(self) -> ESAgent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------------------------
    def _require_params(self) -> VectorParams | ModuleParams:
        if self._params is None:
            raise SolverStateError(
                "this ESAgent has no weights yet: pass model= to ESAgent(...) or call "
                "load_weights(weights) first"
            )
        return self._params

    def _check_dim(self, vector: np.ndarray) -> np.ndarray:
        dim = self._require_params().dim
        if vector.size != dim:
            raise ValueError(
                f"load_weights: got {vector.size} weights, the model has {dim}; pass weights of "
                "the same model (or build a new ESAgent for a different one)"
            )
        return vector


def _info_fields(info: SamplingInfo) -> tuple[int, int, int]:
    return info.key, info.sign, info.version
