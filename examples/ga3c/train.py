"""GA3C on remote workers: CartPole-v1 with every action chosen here, in one batched call a step.

`--actors` worker actors only step `--num-envs` environments each; a predictor thread here
runs a `parl.samplers.CentralSampler`, which chooses the actions of all workers' environments
with one call of the policy a step, and queues each finished rollout of `--n-steps` steps; the
trainer (this thread) takes the rollouts from the queue and makes one A3C update from each,
while the workers step on (Babaeizadeh et al. 2017). The policy never leaves this process: the
case for it is a network too big to copy to every worker.

    python examples/ga3c/train.py                       # a local cluster of 2 CPU slots
    python examples/ga3c/train.py --actors 4 --seed 2
    xparl start --port 8010 --cpu_num 4                 # or an existing cluster
    python examples/ga3c/train.py --address localhost:8010 --actors 4

Training stops once the mean return of the last 10 episodes reaches --target-return. Writes a
TensorBoard summary (with `train/lag`, how many updates a rollout waited), the agent and a
learning curve into `--logdir`.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import gymnasium as gym

import parl
from parl.utils import logger, parse_args, summary
from parl_algos.agents import ActorCriticAgent
from parl_algos.ga3c import GA3C, GA3CLearner
from parl_algos.nets import ActorCriticMLP
from parl_algos.training import OnPolicyArgs, TrainingRun


@dataclass
class Args(OnPolicyArgs):
    actors: int = 2
    """Worker actors, each stepping --num-envs environments (no policy on them)."""
    address: str | None = None
    """HOST:PORT of a running cluster (`xparl start`); default: a local one of --actors slots."""
    num_envs: int = 8
    """Environments each worker steps (a rollout: actors x num-envs x n-steps samples)."""
    queue_size: int = 2
    """Rollouts waiting for the trainer at most."""
    lr: float = 1e-3
    total_steps: int = 300_000
    eval_every: int = 25_000
    target_return: float | None = 475.0
    stop_at_target: bool = True
    logdir: str = "train_log/ga3c"


def make_agent(
    args: Args, observation_space: gym.Space, action_space: gym.Space
) -> ActorCriticAgent:
    """The agent: the predictor samples with it, the trainer learns with it."""
    hidden = (args.hidden_size, args.hidden_size)
    model = ActorCriticMLP(observation_space.shape[0], action_space.n, hidden)
    alg = GA3C(
        model,
        lr=args.lr,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
    )
    return ActorCriticAgent(alg, gamma=args.gamma, gae_lambda=args.gae_lambda)


def main(args: Args) -> dict:
    eval_env = gym.make(args.env_id)
    title = f"GA3C on {args.env_id}, {args.actors} remote workers"
    run = TrainingRun(title, args, total_steps=args.total_steps, eval_env=eval_env)
    if args.address is None:
        parl.connect(cpu_num=args.actors)  # a local cluster, stopped when this process exits
    else:
        parl.connect(args.address)
    agent = make_agent(args, eval_env.observation_space, eval_env.action_space)
    with GA3CLearner(
        agent,
        functools.partial(gym.make, args.env_id),
        num_workers=args.actors,
        envs_per_worker=args.num_envs,
        horizon=args.n_steps,
        seed=args.seed,
        queue_size=args.queue_size,
        timeout=300,
    ) as learner:
        logger.info("%d actors ready, %d environments each", args.actors, args.num_envs)
        run.start()
        for update in learner:
            run.record(update.env_steps, update.episodes, update.stats)
            if learner.updates % 100 == 0:
                summary.add_scalar("train/lag", update.lag, update.env_steps)
            run.maybe_evaluate(agent.predict)
            if update.env_steps >= args.total_steps or run.done:
                break
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
