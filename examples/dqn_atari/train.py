"""DQN on an Atari game (RoadRunner by default): the Nature DQN setup, bounded for a small machine.

The classic preprocessing comes from gymnasium's wrappers (`parl_algos.rollout.make_atari_env`:
`AtariPreprocessing`, up to 30 no-ops at reset, 4 frames per action with max-pooling of the last
two, 84x84 grayscale; `FrameStackObservation`, the last 4 frames are the observation). Rewards
are clipped to their sign for learning; reported returns are the game's scores. The Q-network is
the convolutional network of Mnih et al. 2015 (https://doi.org/10.1038/nature14236,
`parl_algos.nets.NatureQNetwork`) with the double-DQN target, evaluated with epsilon 0.05 as in
the paper. ale-py ships the game ROMs. `parl-train dqn/roadrunner` runs the same setup from a
config (and `rainbow/roadrunner` Rainbow's, `--mode async` Ape-X's).

The defaults are a bounded run: 50k agent steps (200k frames) with a replay memory of 50k
transitions (about 3 GB), some 15 minutes on one busy CPU core, where the paper trains for 50M
steps with a memory of 1M. RoadRunner is a game where that much already shows: random play
scores about 0-40, and this run's training episodes averaged several hundred (see the
repository README). On Breakout the same budget stays at random play's ~1.5.

    python examples/dqn_atari/train.py
    python examples/dqn_atari/train.py --env-id ALE/Breakout-v5 --total-steps 1000000
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from parl.algorithms import DQN
from parl.utils import ReplayMemory, parse_args
from parl_algos.agents import DQNAgent
from parl_algos.nets import NatureQNetwork
from parl_algos.rollout import make_atari_env
from parl_algos.training import OffPolicyArgs, TrainingRun, train_off_policy


@dataclass
class Args(OffPolicyArgs):
    env_id: str = "ALE/RoadRunner-v5"
    total_steps: int = 50_000
    lr: float = 1e-4
    batch_size: int = 32
    buffer_size: int = 50_000
    learning_starts: int = 5_000
    train_freq: int = 4
    hidden_size: int = 512
    target_update_interval: int = 1_000
    """Env steps between two copies of the model into the target network."""
    exploration_steps: int = 25_000
    """Env steps over which epsilon falls from 1 to --eps-end (warm-up steps included)."""
    eps_end: float = 0.01
    """Final exploration rate."""
    eval_epsilon: float = 0.05
    """Exploration rate while evaluating, as in the paper (a greedy agent may never serve)."""
    eval_every: int = 25_000
    eval_episodes: int = 3
    logdir: str = "train_log/dqn_atari"
    torch_threads: int = 1


def main(args: Args) -> dict:
    env, eval_env = make_atari_env(args.env_id), make_atari_env(args.env_id)
    run = TrainingRun(
        f"DQN on {args.env_id}", args, total_steps=args.total_steps, eval_env=eval_env
    )
    n_actions = env.action_space.n
    model = NatureQNetwork(n_actions, hidden=args.hidden_size)
    alg = DQN(model, lr=args.lr, gamma=args.gamma)
    agent = DQNAgent(
        alg,
        n_actions,
        eps_end=args.eps_end,
        eps_decay_steps=max(args.exploration_steps - args.learning_starts, 1),
        seed=args.seed,
    )
    memory = ReplayMemory(
        args.buffer_size, env.observation_space.shape, 0, obs_dtype=np.uint8, seed=args.seed
    )

    def after_step(step: int) -> None:
        if step % args.target_update_interval == 0:
            alg.sync_target()

    rng = np.random.default_rng(args.seed + 1)

    def eval_policy(obs: np.ndarray) -> int:
        if rng.random() < args.eval_epsilon:
            return int(rng.integers(n_actions))
        return agent.predict(obs)

    train_off_policy(
        run,
        env,
        agent,
        memory,
        args,
        after_step=after_step,
        reward_fn=np.sign,
        eval_policy=eval_policy,
    )
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
