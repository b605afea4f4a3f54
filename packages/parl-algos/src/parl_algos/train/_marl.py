"""Multi-agent configs of `parl-train`: MADDPG, MAPPO and QMIX on PettingZoo's MPE.

`[env]` names an environment of `mpe2` (`id = "simple_spread_v3"`) and its episode length.
Each run plays it as a `StackedAgentsEnv` (the agents' observations stacked row by row, the
team's reward the mean of the agents'), so that a training episode's return, like an
evaluation's, is each agent's episode return averaged over the agents, the measure of the
`examples/mpe` example. The loops are the example's (MADDPG: a joint transition a step, one
update every `train_freq` steps; MAPPO: `num_envs` whole episodes, then PPO's epochs; QMIX:
whole episodes into an `EpisodeMemory`, one update after each, epsilon-greedy acting), written
so that their state is in the checkpoint but for the environments: a resumed run makes them
anew (MADDPG's episode under way starts again). `total_steps` counts env steps, each moving
every agent. Each steps `agent.num_envs` environments together (MADDPG and QMIX: 1 by
default, their single-environment loops), picking every agent's action of all of them in one
batch.

Every one also runs in `sync` mode: its environments live on `train.actors` actors of the
cluster (`train.address`, or an embedded one), which step their shares of them each round
(`_marl_actors.EnvGroups`) while the learner acts, stores the transitions in its own memory
and learns; evaluations stay in the learner's process. The actions and seeds are those of
`single` mode, and so are the rows of progress.csv. With `train.restart_actors` an actor that
dies is replaced (`EnvGroups`): MADDPG's environments of the lost step start new episodes
(their half episodes neither counted nor stored past the fault); MAPPO's iteration and QMIX's
round in which an actor died are played again from new episodes.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import parl
from parl_algos.functional import gae
from parl_algos.maddpg import MADDPG, MADDPGStats, MultiAgentActorCriticMLP
from parl_algos.mappo import MAPPO, MAPPOStats, MultiAgentPPOMLP, pack_agent_inputs
from parl_algos.multiagent import EpisodeMemory, MultiAgentReplayMemory, StackedAgentsEnv
from parl_algos.qmix import QMIX, QMixer, QMIXStats, RNNAgent, VDNMixer
from parl_algos.rollout import Episode
from parl_algos.samplers import Replacements
from parl_algos.train._config import Config, ConfigError
from parl_algos.train._envs import connect
from parl_algos.train._marl_actors import EnvGroups, MultiAgentEnvSection, make_mpe_env
from parl_algos.train._run import Run
from parl_algos.train._spec import AlgorithmSpec, Learner, Trainer

__all__ = [
    "MADDPGSection",
    "MAPPOSection",
    "MULTI_AGENT_SPECS",
    "MultiAgentEnvSection",
    "MultiAgentState",
    "MultiAgentTrainer",
    "QMIXSection",
    "StackedAgent",
    "check_multi_agent",
    "make_mpe_env",
]


@dataclass
class MADDPGSection:
    """`[agent]` of MADDPG (the MADDPG paper's MPE settings)."""

    lr: float = 1e-2
    """Adam learning rate of the actors and the critics."""
    gamma: float = 0.95
    tau: float = 0.01
    """Polyak rate of the target networks."""
    batch_size: int = 1024
    buffer_size: int = 1_000_000
    learning_starts: int = 1000
    """Env steps of uniformly random actions before learning starts."""
    train_freq: int = 25
    """Env steps between two updates."""
    hidden_size: int = 64
    centralized: bool = True
    """Critics on every agent's observation and action (false: independent DDPG)."""
    num_envs: int = 1
    """Environments stepped together, one joint transition each a step."""


@dataclass
class MAPPOSection:
    """`[agent]` of MAPPO."""

    lr: float = 7e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_envs: int = 8
    """Environments played per iteration, one whole episode each."""
    update_epochs: int = 10
    """Passes over each iteration's batch (one minibatch: the whole batch)."""
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    hidden_size: int = 64
    centralized: bool = True
    """A value function on the global state (false: on the agent's own observation)."""
    value_norm: bool = False
    """The value function learns returns standardised by their running statistics (the MAPPO
    paper's value normalisation)."""
    separate_optimizers: bool = False
    """One Adam for the actor and one for the critic, each clipping its own gradient's norm
    (the MAPPO paper's setting); false: one Adam and one clip over both."""


@dataclass
class QMIXSection:
    """`[agent]` of QMIX."""

    lr: float = 5e-4
    gamma: float = 0.99
    batch_size: int = 32
    """Episodes per update."""
    buffer_size: int = 5000
    """Episodes kept."""
    hidden_size: int = 64
    """Width of the recurrent agent network."""
    mixing_embed_dim: int = 32
    """Width of the mixing network."""
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_steps: int = 50_000
    """Env steps over which epsilon falls linearly from eps_start to eps_end."""
    target_update_interval: int = 200
    """Episodes between two copies of the networks into their targets."""
    mixer: str = "qmix"
    """'qmix' (the monotonic mixing network), 'vdn' (a sum) or 'none' (independent
    Q-learners: each agent's own Q-value regressed on the team's reward, nothing mixed)."""
    num_envs: int = 1
    """Environments played together, one whole episode each, then one update per episode."""


_MIXERS = ("qmix", "vdn", "none")
"""QMIX's `agent.mixer` values."""


def check_multi_agent(config: Config) -> None:
    """Raise `ConfigError` for an unknown environment or a value outside its range."""
    if importlib.util.find_spec(f"mpe2.{config.env.id}") is None:
        raise ConfigError(
            f"env.id={config.env.id!r} is not an mpe2 environment (e.g. simple_spread_v3)"
        )
    if config.env.max_cycles < 1:
        raise ConfigError(f"env.max_cycles={config.env.max_cycles} must be at least 1")
    if config.agent.num_envs < 1:
        raise ConfigError(f"agent.num_envs={config.agent.num_envs} must be at least 1")
    if getattr(config.agent, "mixer", "qmix") not in _MIXERS:
        raise ConfigError(f"agent.mixer={config.agent.mixer!r}; allowed: {', '.join(_MIXERS)}")
    if config.algorithm == "QMIX":
        env = make_mpe_env(config.env)
        counts = sorted({int(s.n) for s in env.arrays.action_spaces})
        env.close()
        if len(counts) > 1:
            raise ConfigError(
                f"env.id={config.env.id!r}: its agents have {counts} actions; QMIX needs the "
                "same number for every agent (MADDPG and MAPPO take different ones)"
            )


class StackedAgent(parl.Agent):
    """A multi-agent algorithm acting on a `StackedAgentsEnv`'s `(n_agents, obs)` rows.

    `predict` (evaluation) gives one discrete action per agent. MAPPO's value needs the global
    state and QMIX's agents a recurrent state: the evaluation environment keeps `state` and
    `hidden` current (`hidden` back to None at each reset).

    Args:
        algorithm: `MADDPG`, `MAPPO` or `QMIX`.
        obs_dims: each agent's observation size (its row's first columns).
    """

    def __init__(self, algorithm: parl.Algorithm, obs_dims: tuple[int, ...]) -> None:
        super().__init__(algorithm)
        self.obs_dims = obs_dims
        self.state: np.ndarray | None = None
        """The global state that goes with the next observation."""
        self.hidden: torch.Tensor | None = None
        """QMIX: the recurrent state of the episode being played."""

    def split(self, obs: np.ndarray) -> list[torch.Tensor]:
        """Each agent's `(1, obs_dim)` observation from the stacked rows."""
        return [torch.from_numpy(obs[i, :d]).unsqueeze(0) for i, d in enumerate(self.obs_dims)]

    def predict(self, obs: np.ndarray) -> np.ndarray:
        """The greedy action of each agent, `(n_agents,)` int64."""
        alg = self.alg
        if isinstance(alg, MADDPG):
            return np.array([int(a[0].argmax()) for a in alg.predict(self.split(obs))])
        if isinstance(alg, MAPPO):
            rows = pack_agent_inputs(torch.from_numpy(obs), torch.from_numpy(self.state))
            return alg.predict(rows).numpy()
        if self.hidden is None:
            self.hidden = alg.init_hidden()
        action, self.hidden = alg.predict(torch.from_numpy(obs), self.hidden)
        return action.numpy()


class _EvalEnv(StackedAgentsEnv):
    """The evaluation environment: it keeps the agent's global and recurrent states current."""

    agent: StackedAgent

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        obs, info = super().reset(seed=seed, options=options)
        self.agent.state, self.agent.hidden = info["state"], None
        return obs, info

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = super().step(action)
        self.agent.state = info["state"]
        return obs, reward, terminated, truncated, info


def _eval_env(config: Config, agent: StackedAgent) -> _EvalEnv:
    env = make_mpe_env(config.env, _EvalEnv)
    assert isinstance(env, _EvalEnv)
    env.agent = agent
    return env


# -- builders ------------------------------------------------------------------------------------


@dataclass
class MultiAgentState:
    """What a multi-agent run's loop keeps from one step to the next.

    Checkpoints keep it all but the environments and MADDPG's episodes under way (PettingZoo's
    environments do not survive pickling: a resumed run makes them anew and starts new
    episodes; MAPPO and QMIX start one at every iteration anyway).
    """

    rng: np.random.Generator
    """The generator of the episodes' seeds."""
    n_actions: list[int]
    """Each agent's number of actions."""
    envs: EnvGroups
    """The environments, here or on actors."""
    memory: MultiAgentReplayMemory | EpisodeMemory | None = None
    """MADDPG's transitions, QMIX's episodes."""
    dims: tuple[int, int, int] | None = None
    """MAPPO: agents, the largest observation, the state."""
    obs: np.ndarray | None = None
    """MADDPG: every environment's observations."""
    ret: np.ndarray | None = None
    """MADDPG: every environment's episode return so far."""
    length: np.ndarray | None = None
    """MADDPG: every environment's episode length so far."""
    stats: Any = None
    """The latest update's stats."""
    episodes: int = 0
    """QMIX: episodes stored."""
    unsaved: tuple[str, ...] = field(default=("envs", "obs", "ret", "length"), repr=False)
    """What checkpoints leave out (see above)."""

    def state_dict(self) -> dict[str, Any]:
        """The fields a checkpoint keeps."""
        return {k: v for k, v in vars(self).items() if k not in (*self.unsaved, "unsaved")}


def _build(config: Config, remote: bool) -> tuple[StackedAgent, _EvalEnv, MultiAgentState]:
    """The agent, the evaluation environment and the loop's state.

    `remote`: the environments on `train.actors` actors of the connected cluster.
    """
    a, seed = config.agent, config.train.seed
    torch.manual_seed(seed)
    env = make_mpe_env(config.env)
    arrays = env.arrays
    env.close()
    n_actions = [int(s.n) for s in arrays.action_spaces]
    hidden = (a.hidden_size, a.hidden_size)
    rng = np.random.default_rng(seed)
    memory: MultiAgentReplayMemory | EpisodeMemory | None = None
    dims = None
    if config.algorithm == "MADDPG":
        model = MultiAgentActorCriticMLP(
            arrays.obs_dims, n_actions, hidden, centralized=a.centralized
        )
        alg: parl.Algorithm = MADDPG(
            model, actor_lr=a.lr, critic_lr=a.lr, gamma=a.gamma, tau=a.tau, seed=seed
        )
        capacity = min(a.buffer_size, config.train.total_steps)
        memory = MultiAgentReplayMemory(capacity, arrays.obs_dims, n_actions, seed=seed)
    elif config.algorithm == "MAPPO":
        model = MultiAgentPPOMLP(
            arrays.max_obs_dim,
            arrays.state_dim,
            arrays.n_agents,
            n_actions,
            hidden,
            centralized=a.centralized,
        )
        rows = config.env.max_cycles * a.num_envs * arrays.n_agents
        alg = MAPPO(
            model,
            lr=a.lr,
            clip_coef=a.clip_coef,
            ent_coef=a.ent_coef,
            update_epochs=a.update_epochs,
            minibatch_size=rows,
            value_norm=a.value_norm,
            separate_optimizers=a.separate_optimizers,
            seed=seed,
        )
        dims = (arrays.n_agents, arrays.max_obs_dim, arrays.state_dim)
    else:
        n = arrays.n_agents
        model = RNNAgent(arrays.max_obs_dim + n, n_actions[0], a.hidden_size)
        mixer = {
            "qmix": lambda: QMixer(n, arrays.state_dim, a.mixing_embed_dim),
            "vdn": VDNMixer,
            "none": lambda: None,
        }[a.mixer]()
        alg = QMIX(model, mixer, n_agents=n, lr=a.lr, gamma=a.gamma, seed=seed)
        memory = EpisodeMemory(
            a.buffer_size,
            config.env.max_cycles,
            n,
            arrays.max_obs_dim,
            arrays.state_dim,
            n_actions[0],
            seed=seed,
        )
    train = config.train
    replacements = None
    if remote and train.restart_actors:
        replacements = Replacements(
            f"{config.algorithm}: actor {{i}}", train.max_restarts, setting="train.max_restarts"
        )
    envs = EnvGroups(
        config.env,
        a.num_envs,
        actors=train.actors if remote else None,
        replacements=replacements,
        seed=seed,
    )
    agent = StackedAgent(alg, arrays.obs_dims)
    state = MultiAgentState(rng, n_actions, envs, memory=memory, dims=dims)
    return agent, _eval_env(config, agent), state


# -- loops ---------------------------------------------------------------------------------------


def _seeds(state: MultiAgentState, n: int) -> list[int]:
    """The next `n` episode seeds of the run."""
    return [int(state.rng.integers(2**31)) for _ in range(n)]


def _maddpg_loop(
    config: Config, run: Run, agent: StackedAgent, state: MultiAgentState, total: int
) -> None:
    """Rounds of one step of every environment (`E` joint transitions), then the updates due.

    Env step `k` of the run is environment `(k - 1) % E`'s step of its round: it acts uniformly at
    random while `k <= learning_starts`, and an update follows the round for every `k` that is
    a multiple of `train_freq` past `learning_starts`. An environment whose episode ended is
    reset with the run's next seed.
    """
    a, envs, memory, rng = config.agent, state.envs, state.memory, state.rng
    assert isinstance(memory, MultiAgentReplayMemory)
    eye = [np.eye(n, dtype=np.float32) for n in state.n_actions]
    dims, E = agent.obs_dims, len(envs)
    if state.obs is None:  # a new run, or a resumed one: new episodes
        state.obs, _ = envs.reset(_seeds(state, E))
        state.ret, state.length, state.stats = np.zeros(E), np.zeros(E, np.int64), None
    ret, length = state.ret, state.length
    assert ret is not None and length is not None
    run.start()
    try:
        while run.env_steps < total and not run.done:
            obs, first = state.obs, run.env_steps + 1
            steps = range(first, first + E)
            action = np.zeros((E, len(dims)), np.int64)
            if steps[-1] > a.learning_starts:
                split = [torch.from_numpy(obs[:, i, :d]) for i, d in enumerate(dims)]
                action[:] = torch.stack([x.argmax(-1) for x in agent.alg.sample(split)], -1)
            for e, step in enumerate(steps):
                if step <= a.learning_starts:
                    action[e] = [int(rng.integers(len(x))) for x in eye]
            next_obs, _, rewards, terminated, done = envs.step(action)
            episodes, ended, restarted = [], [], set(envs.restarted)
            for e in range(E):
                if e in restarted:  # its actor died: a new episode, the half one not counted
                    ret[e], length[e] = 0.0, 0
                    continue
                memory.append(
                    [obs[e, i, :d] for i, d in enumerate(dims)],
                    [x[j] for x, j in zip(eye, action[e], strict=True)],
                    rewards[e],
                    [next_obs[e, i, :d] for i, d in enumerate(dims)],
                    np.full(len(dims), float(terminated[e]), np.float32),
                )
                ret[e] += float(np.mean(rewards[e]))  # the team's reward
                length[e] += 1
                if done[e]:
                    episodes.append(Episode(steps[e], float(ret[e]), int(length[e])))
                    ended.append(e)
                    ret[e], length[e] = 0.0, 0
            if ended:
                next_obs[ended] = envs.reset(_seeds(state, len(ended)), ended)[0]
            state.obs = next_obs
            for step in steps:
                if step > a.learning_starts and step % a.train_freq == 0:
                    state.stats = agent.alg.learn(*memory.sample(a.batch_size))
            run.record(steps[-1], episodes, state.stats)
            run.maybe_evaluate(agent.predict)
    finally:
        envs.close()


def _mappo_loop(
    config: Config, run: Run, agent: StackedAgent, loop: MultiAgentState, total: int
) -> None:
    a, envs, alg = config.agent, loop.envs, agent.alg
    assert isinstance(alg, MAPPO) and loop.dims is not None
    (N, D, S), T, E = loop.dims, config.env.max_cycles, len(envs)
    run.start()
    try:
        while run.env_steps < total and not run.done:
            obs = np.zeros((T + 1, E, N, D), np.float32)
            state = np.zeros((T + 1, E, S), np.float32)
            action = torch.zeros((T, E, N), dtype=torch.int64)
            reward = np.zeros((T, E, N), np.float32)
            terminated = np.zeros((T, E, N), np.float32)
            done = np.zeros((T, E, N), np.float32)
            seeds = _seeds(loop, E)
            obs[0], state[0] = envs.reset(seeds)
            for t in range(T):
                action[t] = alg.sample(
                    pack_agent_inputs(torch.from_numpy(obs[t]), torch.from_numpy(state[t]))
                )
                o, s, r, term, end = envs.step(action[t].numpy())
                if envs.restarted:  # an actor died: the iteration's episodes are played again
                    break
                obs[t + 1], state[t + 1], reward[t] = o, s, r
                terminated[t], done[t] = term[:, None], end[:, None]
            else:
                _mappo_update(a, run, alg, obs, state, action, reward, terminated, done)
            run.maybe_evaluate(agent.predict)
    finally:
        envs.close()


def _mappo_update(
    a: Any,
    run: Any,
    alg: MAPPO,
    obs: np.ndarray,
    state: np.ndarray,
    action: torch.Tensor,
    reward: np.ndarray,
    terminated: np.ndarray,
    done: np.ndarray,
) -> None:
    """PPO's epochs on one iteration's `(T, E, ...)` episodes; record them."""
    T, E = reward.shape[:2]
    b_obs, b_state = torch.from_numpy(obs), torch.from_numpy(state)
    with torch.no_grad():
        values = alg.value(pack_agent_inputs(b_obs, b_state))  # in the returns' scale
        log_prob = alg.distribution(pack_agent_inputs(b_obs[:-1], b_state[:-1])).log_prob(action)
    advantage = gae(
        torch.from_numpy(reward),
        values[:-1],
        values[1:],
        torch.from_numpy(terminated),
        torch.from_numpy(done),
        a.gamma,
        a.gae_lambda,
    )
    stats = alg.learn(
        b_obs[:-1].flatten(0, 1),
        b_state[:-1].flatten(0, 1),
        action.flatten(0, 1),
        advantage.flatten(0, 1),
        (advantage + values[:-1]).flatten(0, 1),
        values[:-1].flatten(0, 1),
        log_prob.flatten(0, 1),
    )
    steps = run.env_steps + T * E
    returns = reward.sum(0).mean(-1)  # each environment's episode, mean over agents
    run.record(steps, [Episode(steps, float(r), T) for r in returns], stats)


def _qmix_loop(
    config: Config, run: Run, agent: StackedAgent, loop: MultiAgentState, total: int
) -> None:
    """Rounds of one whole episode in every environment, the agents acting in one batch.

    After a round each episode goes into the memory and one update follows it, as if the
    episodes had been played one after the other in one environment. The episodes of a round
    must end together (MPE's all last `env.max_cycles` steps).
    """
    a, envs, memory, alg = config.agent, loop.envs, loop.memory, agent.alg
    assert isinstance(memory, EpisodeMemory)
    E = len(envs)
    run.start()
    try:
        while run.env_steps < total and not run.done:
            obs, state = envs.reset(_seeds(loop, E))
            hidden, ret, t, done = alg.init_hidden(E), np.zeros(E), 0, np.zeros(E, bool)
            steps: list[tuple[np.ndarray, ...]] = []
            while not done.all():
                if done.any():
                    raise RuntimeError(
                        f"QMIX's episodes of one round ended at different steps ({done=}): "
                        "run it with agent.num_envs = 1"
                    )
                fraction = min((run.env_steps + t * E) / max(a.eps_decay_steps, 1), 1.0)
                epsilon = a.eps_start + fraction * (a.eps_end - a.eps_start)
                action, hidden = alg.sample(torch.from_numpy(obs), hidden, epsilon)
                next_obs, next_state, rewards, terminated, done = envs.step(action.numpy())
                if envs.restarted:  # an actor died: the round's episodes are played again
                    break
                reward = np.array([np.mean(r) for r in rewards])  # the team's reward
                steps.append((obs, state, action.numpy(), reward, terminated, next_obs, next_state))
                obs, state, ret, t = next_obs, next_state, ret + reward, t + 1
            if envs.restarted:
                continue
            for e in range(E):
                for step in steps:
                    o, s, u, r, term, o2, s2 = (x[e] for x in step)
                    memory.append(o, s, u, float(r), bool(term), o2, s2)
                memory.end_episode()
                loop.episodes += 1
                if len(memory) >= a.batch_size:
                    loop.stats = alg.learn(*memory.sample(a.batch_size))
                if loop.episodes % a.target_update_interval == 0:
                    alg.sync_target()
            end = run.env_steps + t * E
            run.record(end, [Episode(end, float(r), t) for r in ret], loop.stats)
            run.maybe_evaluate(agent.predict)
    finally:
        envs.close()


_LOOPS = {"MADDPG": _maddpg_loop, "MAPPO": _mappo_loop, "QMIX": _qmix_loop}


def _connect(config: Config, logdir: str) -> bool:
    """`AlgorithmSpec.prepare`: in `sync` mode, connect to the run's cluster; whether it did."""
    if config.train.mode != "sync":
        return False
    connect(config)
    return True


class MultiAgentTrainer(Trainer):
    """The loop of a multi-agent config (see the module's docstring).

    Args:
        config: the run's config.
        remote: the environments on actors of the connected cluster (`sync` mode).
    """

    def __init__(self, config: Config, remote: bool) -> None:
        self.config = config
        self.agent, self.eval_env, self.loop = _build(config, remote)
        self.title = f"{config.algorithm} on {config.env.id}"

    def state_dict(self) -> dict[str, Any]:
        """`Trainer.state_dict` and the loop's but the environments and the episodes under way."""
        return {**super().state_dict(), **self.loop.state_dict()}

    def load_state_dict(self, state: dict[str, Any], env_steps: int) -> None:
        """Go on with the checkpoint's memory, generator and counters (new episodes)."""
        for name in self.loop.state_dict():
            setattr(self.loop, name, state[name])
        super().load_state_dict(state, env_steps)

    def train(self, run: Run) -> None:
        """Play and learn until the budget is spent (the loop closes the environments)."""
        loop = _LOOPS[self.config.algorithm]
        run.restart_sources.append(self.loop.envs)  # its actors replaced: progress.csv's count
        loop(self.config, run, self.agent, self.loop, self.config.train.total_steps)


def _trainer(config: Config, spec: AlgorithmSpec, run: Run, remote: bool) -> Trainer:
    """`AlgorithmSpec.trainer` of the multi-agent algorithms (`prepare` connected them)."""
    return MultiAgentTrainer(config, remote)


def _build_learner(config: Config, obs_space: Any, act_space: Any) -> Learner:
    """`AlgorithmSpec.build`: the agent (its environment decides the spaces)."""
    agent, eval_env, loop = _build(config, False)
    eval_env.close()
    loop.envs.close()
    return Learner(agent)


MULTI_AGENT_SPECS = tuple(
    AlgorithmSpec(
        name=name,
        family="multi_agent",
        env=MultiAgentEnvSection,
        agent=section,
        stats=stats,
        build=_build_learner,
        trainer=_trainer,
        modes=("single", "sync"),
        check=check_multi_agent,
        prepare=_connect,
    )
    for name, section, stats in (
        ("MADDPG", MADDPGSection, MADDPGStats),
        ("MAPPO", MAPPOSection, MAPPOStats),
        ("QMIX", QMIXSection, QMIXStats),
    )
)
"""The specs of MADDPG, MAPPO and QMIX."""
