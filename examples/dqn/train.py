"""The DQN family on CartPole-v1: `parl.algorithms.DQN` and its options, up to Rainbow.

A Q-network (`parl_algos.nets.QNetwork`) learns from a replay memory with the double-DQN target;
the target network is refreshed every `--target-update-interval` env steps. Each improvement of
the family is a flag: `--dueling` (Wang et al. 2016), `--prioritized` replay (Schaul et al.
2016), `--n-step N` returns (through `parl.utils.NStepAdder`), `--noisy` networks (Fortunato et
al. 2018; epsilon is then 0, the noise explores), `--distributional c51` (Bellemare et al. 2017)
or `qr` (QR-DQN, Dabney et al. 2018). Rainbow is
`--distributional c51 --n-step 3 --dueling --noisy --prioritized`. The defaults are the tuned
CartPole settings of the RL Baselines3 Zoo (`benchmarks/results/learning.json` holds how far
they get, seed by seed). Writes a TensorBoard summary, the agent and a learning curve into
`--logdir`.

    python examples/dqn/train.py
    python examples/dqn/train.py --dueling --prioritized
    python examples/dqn/train.py --distributional qr --n-atoms 10                # QR-DQN
    python examples/dqn/train.py --distributional c51 --n-step 3 --dueling --noisy --prioritized
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import gymnasium as gym

import parl
from parl.algorithms import DQN
from parl.utils import NStepAdder, PrioritizedReplayMemory, ReplayMemory, parse_args
from parl_algos.agents import DQNAgent
from parl_algos.nets import QNetwork
from parl_algos.training import OffPolicyArgs, TrainingRun, train_off_policy


@dataclass
class Args(OffPolicyArgs):
    lr: float = 2.3e-3
    batch_size: int = 64
    buffer_size: int = 100_000
    learning_starts: int = 1000
    train_freq: int = 256
    gradient_steps: int = 128
    target_update_interval: int = 10
    """Env steps between two copies of the model into the target network."""
    exploration_fraction: float = 0.16
    """Fraction of --total-steps over which epsilon decays (warm-up steps included)."""
    eps_end: float = 0.04
    """Final exploration rate."""
    double: bool = True
    """Use the double-DQN target."""
    dueling: bool = False
    """Use a dueling Q-network."""
    prioritized: bool = False
    """Sample the replay memory by priority (TD error)."""
    n_step: int = 1
    """Steps of each stored transition's return (n-step learning)."""
    noisy: bool = False
    """Noisy layers in the Q-network's head explore instead of epsilon."""
    distributional: str | None = None
    """None, c51 (a categorical return distribution) or qr (quantile regression)."""
    n_atoms: int = 51
    """Atoms (c51) or quantiles (qr) per action."""
    v_min: float = 0.0
    """C51's smallest atom (CartPole's discounted returns lie in [0, 100])."""
    v_max: float = 100.0
    """C51's largest atom."""
    target_return: float | None = 475.0
    logdir: str = "train_log/dqn"


def main(args: Args) -> dict:
    env = gym.make(args.env_id)
    run = TrainingRun(
        f"DQN on {args.env_id}", args, total_steps=args.total_steps, eval_env=gym.make(args.env_id)
    )
    obs_dim, n_actions = env.observation_space.shape[0], env.action_space.n
    n_atoms = 1 if args.distributional is None else args.n_atoms
    model = QNetwork(
        obs_dim,
        n_actions,
        (args.hidden_size, args.hidden_size),
        dueling=args.dueling,
        noisy=args.noisy,
        n_atoms=n_atoms,
    )
    alg = DQN(
        model,
        lr=args.lr,
        gamma=args.gamma,
        double=args.double,
        dueling=args.dueling,
        n_step=args.n_step,
        noisy=args.noisy,
        distributional=args.distributional,
        n_atoms=n_atoms if args.distributional else None,
        v_min=args.v_min,
        v_max=args.v_max,
    )
    decay = max(int(args.exploration_fraction * args.total_steps) - args.learning_starts, 1)
    agent = DQNAgent(
        alg,
        n_actions,
        eps_start=0.0 if args.noisy else 1.0,
        eps_end=0.0 if args.noisy else args.eps_end,
        eps_decay_steps=decay,
        seed=args.seed,
    )
    if args.prioritized:
        updates = args.total_steps * args.gradient_steps // args.train_freq
        memory = PrioritizedReplayMemory(
            args.buffer_size, obs_dim, 0, beta_steps=max(updates, 1), seed=args.seed
        )
    else:
        memory = ReplayMemory(args.buffer_size, obs_dim, 0, seed=args.seed)
    if args.n_step > 1:
        memory = NStepAdder(memory, args.n_step, args.gamma)

    def after_step(step: int) -> None:
        if step % args.target_update_interval == 0:
            alg.sync_target()
        if step % 1000 == 0:
            parl.utils.summary.add_scalar("rollout/epsilon", agent.epsilon, step)

    train_off_policy(run, env, agent, memory, args, after_step=after_step)
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
