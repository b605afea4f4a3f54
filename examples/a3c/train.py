"""A3C on remote actors: CartPole-v1 learned from gradients that arrive asynchronously.

`--actors` actors (`parl_algos.a3c.RemoteA3CActor`), each in its own process of the cluster,
each step `--num-envs` environments for `--n-steps` steps with their own copy of the network,
compute the advantage actor-critic gradient of that rollout and send it to the learner. The
learner (`A3CLearner`) applies each gradient with its RMSprop the moment it arrives, whichever
actor sent it, and the actor pulls the learner's current weights before its next rollout
(every `--pull-every` rollouts): a gradient is computed on weights a few updates old, as in
A3C's asynchronous threads (Mnih et al. 2016). `--actors 0` runs two actors in threads of this
process instead.

    python examples/a3c/train.py                        # a local cluster of 2 CPU slots
    python examples/a3c/train.py --actors 4 --seed 2
    xparl start --port 8010 --cpu_num 4                 # or an existing cluster
    python examples/a3c/train.py --address localhost:8010 --actors 4

Training stops once the mean return of the last 10 episodes reaches --target-return. Writes a
TensorBoard summary (with `train/staleness`, how many updates old each gradient was), the
learner's agent and a learning curve into `--logdir`.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import asdict, dataclass

import gymnasium as gym

import parl
from parl.utils import logger, parse_args, summary
from parl_algos.a3c import A3C, A3CActor, A3CLearner, RemoteA3CActor
from parl_algos.agents import ActorCriticAgent
from parl_algos.nets import ActorCriticMLP
from parl_algos.training import OnPolicyArgs, TrainingRun


@dataclass
class Args(OnPolicyArgs):
    actors: int = 2
    """Remote actors, each stepping --num-envs environments (0: two actors in threads here)."""
    address: str | None = None
    """HOST:PORT of a running cluster (`xparl start`); default: a local one of --actors slots."""
    num_envs: int = 8
    """Environments each actor steps (a gradient's batch: num-envs x n-steps samples)."""
    pull_every: int = 1
    """Rollouts of an actor between two pulls of the learner's weights."""
    lr: float = 1e-3
    total_steps: int = 300_000
    eval_every: int = 25_000
    target_return: float | None = 475.0
    stop_at_target: bool = True
    logdir: str = "train_log/a3c"


def make_agent(
    args: Args, observation_space: gym.Space, action_space: gym.Space
) -> ActorCriticAgent:
    """The learner's agent (each actor gets a copy)."""
    hidden = (args.hidden_size, args.hidden_size)
    model = ActorCriticMLP(observation_space.shape[0], action_space.n, hidden)
    alg = A3C(
        model,
        lr=args.lr,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
    )
    return ActorCriticAgent(alg, gamma=args.gamma, gae_lambda=args.gae_lambda)


def main(args: Args) -> dict:
    eval_env = gym.make(args.env_id)
    where = f"{args.actors} remote actors" if args.actors else "2 actors in threads"
    title = f"A3C on {args.env_id}, {where}"
    run = TrainingRun(title, args, total_steps=args.total_steps, eval_env=eval_env)
    agent = make_agent(args, eval_env.observation_space, eval_env.action_space)  # the learner's
    env_fn = functools.partial(gym.make, args.env_id)
    if args.actors:
        if args.address is None:
            parl.connect(cpu_num=args.actors)  # a local cluster, stopped when this process exits
        else:
            parl.connect(args.address)
    n_actors = args.actors or 2
    actor_cls = RemoteA3CActor if args.actors else A3CActor
    actors = [
        actor_cls(
            env_fn,
            agent if args.actors else copy.deepcopy(agent),  # each actor its own copy
            num_envs=args.num_envs,
            n_steps=args.n_steps,
            seed=args.seed + i * args.num_envs,
        )
        for i in range(n_actors)
    ]
    logger.info("%d actors ready, %d environments each", n_actors, args.num_envs)
    run.start()
    with A3CLearner(agent, actors, pull_every=args.pull_every, timeout=300) as learner:
        for update in learner:
            run.record(update.env_steps, update.episodes, update.stats)
            if learner.version % 100 == 0:
                summary.add_scalar("train/staleness", update.staleness, update.env_steps)
            run.maybe_evaluate(agent.predict)
            if update.env_steps >= args.total_steps or run.done:
                break
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
