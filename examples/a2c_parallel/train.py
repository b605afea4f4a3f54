"""Synchronous A2C on remote actors: CartPole-v1 learned by a central learner fed by N actors.

Each actor (`@parl.remote_class`) lives in its own process of the cluster, steps its own vector
of `--num-envs` environments with its own copy of the model, and turns what it collected into a
flat batch with GAE advantages. Every round the learner sends its weights to all actors (numpy
arrays, `get_weights`), each actor loads them and collects `--n-steps` steps of each of its
environments, and the learner takes one A2C step on the batches of all actors together, as
PARL's A2C example does. One thread per actor drives the blocking calls, so the actors step
their environments at the same time.

A round's batch is actors x num-envs x n-steps samples: with the defaults, 2 actors of 8
environments and 5 steps make 80, twice the batch of `examples/a2c/train.py`, so each round
gives the actors more work for one exchange of weights (the learning rate is 1e-3 to match).
`examples/a2c/train.py --num-envs 16 --lr 1e-3` is the same algorithm in one process.
Training stops once the mean return of the last 10 episodes reaches 475.

    python examples/a2c_parallel/train.py                  # a local cluster of 2 CPU slots
    python examples/a2c_parallel/train.py --actors 4 --seed 2
    xparl start --port 8010 --cpu_num 4                    # or an existing cluster
    python examples/a2c_parallel/train.py --address localhost:8010 --actors 4

Writes a TensorBoard summary, the learner's agent and a learning curve into `--logdir`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np
import torch

import parl
from parl.algorithms import A2C
from parl.utils import logger, parse_args
from parl_algos.agents import ActorCriticAgent
from parl_algos.nets import ActorCriticMLP
from parl_algos.rollout import Episode
from parl_algos.training import OnPolicyArgs, TrainingRun, actor_collector


@dataclass
class Args(OnPolicyArgs):
    actors: int = 2
    """Remote actors, each stepping --num-envs environments with its own copy of the model."""
    address: str | None = None
    """HOST:PORT of a running cluster (`xparl start`); default: a local one of --actors slots."""
    num_envs: int = 8
    """Environments each actor steps (a round's batch: actors x num-envs x n-steps samples)."""
    lr: float = 1e-3
    total_steps: int = 300_000
    eval_every: int = 25_000
    target_return: float | None = 475.0
    stop_at_target: bool = True
    logdir: str = "train_log/a2c_parallel"


def make_agent(
    args: Args, observation_space: gym.Space, action_space: gym.Space
) -> ActorCriticAgent:
    """The learner's agent, and each actor's copy of it (the same network, A2C's settings)."""
    hidden = (args.hidden_size, args.hidden_size)
    model = ActorCriticMLP(observation_space.shape[0], action_space.n, hidden)
    alg = A2C(
        model,
        lr=args.lr,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
    )
    return ActorCriticAgent(alg, gamma=args.gamma, gae_lambda=args.gae_lambda)


@parl.remote_class
class Actor:
    """Steps `num_envs` environments with its own copy of the model; returns batches to learn."""

    def __init__(self, args: Args, index: int) -> None:
        self.collector = actor_collector(args, index, args.num_envs)  # seeded apart from others
        envs = self.collector.envs
        self.agent = make_agent(args, envs.single_observation_space, envs.single_action_space)
        self.n_steps = args.n_steps

    def sample(self, weights: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list]:
        """Load the learner's weights, collect `n_steps` steps of every environment.

        Returns the flat batch (observations, actions, GAE advantages and value targets from
        this actor's value function, which holds the learner's weights), and the episodes
        that ended meanwhile.
        """
        self.agent.set_weights(weights)
        b = self.agent.advantages(self.collector.collect(self.n_steps, self.agent.sample))
        batch = {
            "obs": b.obs.numpy(),
            "action": b.action.numpy(),
            "advantage": b.advantage.numpy(),
            "value_target": b.value_target.numpy(),
        }
        return batch, self.collector.pop_episodes()


def main(args: Args) -> dict:
    title, eval_env = f"A2C on {args.env_id}, {args.actors} remote actors", gym.make(args.env_id)
    run = TrainingRun(title, args, total_steps=args.total_steps, eval_env=eval_env)
    if args.address is None:
        parl.connect(cpu_num=args.actors)  # a local cluster, stopped when this process exits
    else:
        parl.connect(args.address)
    agent = make_agent(args, eval_env.observation_space, eval_env.action_space)  # the learner's

    # One thread per actor: blocking calls from different threads run on the actors together.
    with ThreadPoolExecutor(args.actors, thread_name_prefix="actor") as pool:
        actors = list(pool.map(lambda i: Actor(args, i), range(args.actors)))
        logger.info("%d actors ready, %d environments each", args.actors, args.num_envs)
        run.start()
        env_steps = 0
        while env_steps < args.total_steps and not run.done:
            weights = agent.get_weights()
            calls = [pool.submit(actor.sample, weights) for actor in actors]
            results = [call.result() for call in calls]  # the round waits for every actor
            batch = {
                key: torch.as_tensor(np.concatenate([b[key] for b, _ in results]))
                for key in results[0][0]
            }
            stats = agent.alg.learn(
                batch["obs"], batch["action"], batch["advantage"], batch["value_target"]
            )
            env_steps += len(batch["obs"])
            # Each actor counts its own steps: the learner dates episodes by the round's end.
            episodes = [Episode(env_steps, e.ret, e.length) for _, ended in results for e in ended]
            run.record(env_steps, episodes, stats)
            run.maybe_evaluate(agent.predict)
        del actors  # frees the actors and their CPU slots
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
