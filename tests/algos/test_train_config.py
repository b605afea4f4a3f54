"""`parl-train`'s configs: the shipped files, dotted overrides and the errors before anything runs.

These run the command line in this process (`main(argv)`), except for the console-script
check; nothing here trains.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from parl.utils import PrioritizedReplayMemory
from parl_algos.train import (
    SPECS,
    ConfigError,
    apply_override,
    dump_config,
    load_config,
    main,
    shipped_configs,
)
from parl_algos.train._cli import resolve

REQUIRED = {
    "ppo/cartpole",
    "dqn/cartpole",
    "a2c/cartpole",
    "sac/pendulum",
    "ddpg/pendulum",
    "td3/pendulum",
    "impala/cartpole",
}
DQN_FAMILY = {
    "ddqn/cartpole",
    "duelingdqn/cartpole",
    "c51/cartpole",
    "qrdqn/cartpole",
    "rainbow/cartpole",
}
TRAIN_KEYS = {
    "total_steps",
    "seed",
    "mode",
    "actors",
    "eval_every",
    "eval_episodes",
    "target_return",
    "checkpoint_every",
    "log_every",
}


def test_the_required_configs_are_shipped_and_load():
    assert set(shipped_configs()) >= REQUIRED
    for name in shipped_configs():
        config = load_config(name)
        assert config.algorithm in SPECS
        assert config.train.mode == "single"
        assert config.algorithm.lower() == name.split("/")[0]
        assert {f.name for f in dataclasses.fields(config.train)} >= TRAIN_KEYS


def test_shipped_configs_keep_the_example_scripts_hyperparameters():
    ppo, dqn = load_config("ppo/cartpole"), load_config("dqn/cartpole")
    assert (ppo.agent.n_steps, ppo.agent.lr, ppo.agent.gae_lambda, ppo.env.num_envs) == (
        32,
        1e-3,
        0.8,
        8,
    )
    assert (dqn.agent.train_freq, dqn.agent.gradient_steps, dqn.agent.lr) == (256, 128, 2.3e-3)
    assert load_config("sac/pendulum").train.target_return == -200.0


MUJOCO = {"hopper": "Hopper-v5", "halfcheetah": "HalfCheetah-v5", "walker2d": "Walker2d-v5"}


def test_the_mujoco_configs_keep_the_papers_and_the_zoos_hyperparameters():
    for task, env_id in MUJOCO.items():
        ppo, sac, td3 = (load_config(f"{a}/{task}") for a in ("ppo", "sac", "td3"))
        assert {ppo.env.id, sac.env.id, td3.env.id} == {env_id}
        assert {c.train.total_steps for c in (ppo, sac, td3)} == {1_000_000}
        # The PPO paper's: 2048 steps a batch, 10 epochs of 64, lr 3e-4 annealed.
        a = ppo.agent
        assert (ppo.env.num_envs * a.n_steps, a.update_epochs, a.minibatch_size) == (2048, 10, 64)
        assert (a.lr, a.anneal, a.gamma, a.gae_lambda, a.clip_coef) == (3e-4, True, 0.99, 0.95, 0.2)
        # SAC's papers and the Zoo's: lr 3e-4, batch 256, 256-wide layers, 10k random steps.
        a = sac.agent
        assert (a.lr, a.batch_size, a.hidden_size, a.learning_starts) == (3e-4, 256, 256, 10_000)
        assert (a.gamma, a.tau, a.alpha, a.buffer_size) == (0.99, 0.005, None, 1_000_000)
        # TD3's: the Zoo's lr 1e-3 and noise 0.1, the paper's target smoothing and delay.
        a = td3.agent
        assert (a.lr, a.batch_size, a.exploration_noise, a.learning_starts) == (
            1e-3,
            256,
            0.1,
            10_000,
        )
        assert (a.policy_noise, a.noise_clip, a.policy_delay, a.gamma) == (0.2, 0.5, 2, 0.99)


def build(name: str, *overrides: tuple[str, str]):
    config = load_config(name)
    for key, text in overrides:
        apply_override(config, key, text)
    env = gym.make(config.env.id)
    return SPECS[config.algorithm].build(config, env.observation_space, env.action_space)


def test_the_dqn_family_is_shipped_each_member_with_its_options():
    assert set(shipped_configs()) >= DQN_FAMILY
    options = {}
    for name in sorted(DQN_FAMILY | {"dqn/cartpole"}):
        learner = build(name)
        alg = learner.agent.alg
        prioritized = isinstance(learner.memory, PrioritizedReplayMemory)
        options[name] = (alg.double, alg.dueling, alg.noisy, alg.distributional, alg.n_step)
        options[name] += (prioritized,)
        assert learner.n_step == alg.n_step
    assert options == {
        "c51/cartpole": (False, False, False, "c51", 1, False),
        "ddqn/cartpole": (True, False, False, None, 1, False),
        "dqn/cartpole": (True, False, False, None, 1, False),
        "duelingdqn/cartpole": (True, True, False, None, 1, False),
        "qrdqn/cartpole": (False, False, False, "qr", 1, False),
        "rainbow/cartpole": (True, True, True, "c51", 3, True),
    }
    assert build("qrdqn/cartpole").agent.alg.n_atoms == 10
    assert build("rainbow/cartpole").agent.epsilon == 0.0  # the noise explores


def test_a_dqn_configs_adam_epsilon_and_gradient_clip_reach_the_algorithm():
    alg = build("qrdqn/cartpole").agent.alg
    assert (alg.max_grad_norm, alg.optimizer.param_groups[0]["eps"]) == (10.0, 1e-8)
    overrides = ("agent.adam_eps", "7.8125e-5"), ("agent.max_grad_norm", "none")
    alg = build("qrdqn/cartpole", *overrides).agent.alg
    assert (alg.max_grad_norm, alg.optimizer.param_groups[0]["eps"]) == (None, 7.8125e-5)


def test_a_dqn_configs_priority_exponents_reach_the_replay_memory(capsys, tmp_path):
    memory = build("rainbow/cartpole").memory
    assert (memory.alpha, memory.beta) == (0.6, 0.4)
    overrides = ("agent.priority_alpha", "0.5"), ("agent.priority_beta", "0.2")
    memory = build("rainbow/cartpole", *overrides).memory
    assert (memory.alpha, memory.beta) == (0.5, 0.2)
    assert build("rainbow/cartpole").memory.weight_norm == "batch"
    memory = build("rainbow/cartpole", ("agent.priority_weight_norm", "memory")).memory
    assert memory.weight_norm == "memory"
    assert build("rainbow/cartpole").memory.stratified
    assert not build("rainbow/cartpole", ("agent.priority_stratified", "false")).memory.stratified
    assert build("rainbow/cartpole").agent.alg.c51_priority == "kl"
    overridden = build("rainbow/cartpole", ("agent.c51_priority", "cross_entropy"))
    assert overridden.agent.alg.c51_priority == "cross_entropy"
    for key, text, message in (
        ("priority_alpha", "-0.5", "agent.priority_alpha=-0.5 must be non-negative"),
        ("priority_beta", "1.5", "agent.priority_beta=1.5 must be in [0, 1]"),
        ("c51_priority", "l2", "agent.c51_priority='l2'; allowed: 'kl', 'cross_entropy'"),
        (
            "priority_weight_norm",
            "max",
            "agent.priority_weight_norm='max'; allowed: 'memory', 'batch'",
        ),
    ):
        argv = ["rainbow/cartpole", f"--agent.{key}", text, "--logdir", str(tmp_path / key)]
        assert main(argv) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / key).exists()


def test_noisy_epsilon_gives_a_noisy_network_the_epsilon_schedule_in_every_mode():
    schedule = ("agent.exploration_fraction", "0.5"), ("agent.eps_end", "0.1")
    agent = build("rainbow/cartpole", *schedule).agent
    assert (agent.eps_start, agent.eps_end) == (0.0, 0.0)  # the noise alone explores
    agent = build("rainbow/cartpole", *schedule, ("agent.noisy_epsilon", "true")).agent
    assert (agent.eps_start, agent.eps_end) == (1.0, 0.1)
    assert agent.alg.noisy
    # On actors: the sync schedule's epsilon and Ape-X's per-actor ones, past the warm-up.
    for mode in ("sync", "async"):
        for noisy_epsilon, positive in (("false", False), ("true", True)):
            overrides = (*schedule, ("train.mode", mode), ("agent.noisy_epsilon", noisy_epsilon))
            acting = build("rainbow/cartpole", *overrides).acting
            acting.env_steps = acting.learning_starts + 10
            acting.actors = {7: 0, 8: 1}
            epsilons = (
                [acting.scheduled_epsilon()]
                if mode == "sync"
                else list(acting.actor_epsilons().values())
            )
            assert all((e > 0) == positive for e in epsilons), (mode, noisy_epsilon, epsilons)


def test_noisy_acting_false_acts_on_the_means_everywhere_and_needs_epsilon(capsys, tmp_path):
    eps = ("agent.noisy_epsilon", "true")
    assert build("rainbow/cartpole").agent.act_with_noise
    means = ("agent.noisy_acting", "false")
    assert not build("rainbow/cartpole", eps, means).agent.act_with_noise
    obs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    for act_with_noise, noise in ((True, "true"), (False, "false")):
        overrides = (eps, ("agent.noisy_acting", noise), ("train.mode", "async"))
        acting = build("rainbow/cartpole", *overrides).acting
        assert acting.act_with_noise is act_with_noise
        acting.epsilon = 0.0
        first, again = acting.sample(obs)[1]["q"], acting.sample(obs)[1]["q"]
        # A copy draws new noise for every batch of actions, or acts on the means.
        assert np.array_equal(first, again) is not act_with_noise
        acting.agent.alg.model.eval()
        means = acting.sample(obs)[1]["q"]
        acting.agent.alg.model.train()
        assert np.allclose(first, means) is not act_with_noise
    argv = ["rainbow/cartpole", "--agent.noisy_acting", "false", "--logdir", str(tmp_path / "r")]
    assert main(argv) == 2
    assert "agent.noisy_acting = false acts on the noisy layers' means" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_weights_go_to_the_actors_every_batch_or_every_weights_every_env_steps():
    from parl.samplers import SerialSampler
    from parl_algos.train._envs import SamplerCollector

    class Sender(SerialSampler):  # notes the env steps at each send
        sent: list[int]

        def sync_weights(self) -> None:
            self.sent.append(self.env_steps)

    class Left:
        def sample(self, obs):
            return [0] * len(obs)

    every_batch = [0, 8, 16, 24, 32, 40]
    for every, expected in ((0, every_batch), (20, [0, 24]), (8, every_batch)):
        sampler = Sender(lambda: gym.make("CartPole-v1"), Left(), 1, 1, horizon=8)
        sampler.sent = []
        collector = SamplerCollector(sampler, weights_every=every)
        for _ in range(6):
            collector.collect(0)
        assert sampler.sent == expected and collector.weights_sent == len(expected)
        collector.close()


def test_weights_every_is_refused_outside_the_replay_based_algorithms(capsys, tmp_path):
    for argv, message in (
        (["ppo/cartpole", "--train.weights_every", "100"], "PPO's actors get them before every"),
        (["dqn/cartpole", "--train.weights_every", "-1"], "train.weights_every=-1 must be 0 or"),
        (["ppo/cartpole", "--train.max_restarts", "-1"], "train.max_restarts=-1 must be 0 or"),
    ):
        assert main([*argv, "--logdir", str(tmp_path / "r")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_dqn_agent_on_actors_acts_with_the_learners_exploration():
    assert build("dqn/cartpole").acting is None  # single mode: the agent acts itself
    for mode in ("sync", "async"):
        acting = build("dqn/cartpole", ("train.mode", mode), ("train.actors", "4")).acting
        assert acting.mode == mode and len(acting.epsilons) == 4


def test_a_dqn_option_outside_its_values_is_refused_before_anything_starts(capsys, tmp_path):
    argv = ["dqn/cartpole", "--agent.distributional", "iqn", "--logdir", str(tmp_path / "r")]
    assert main(argv) == 2
    assert "agent.distributional='iqn'; allowed: none, c51, qr" in capsys.readouterr().err
    assert main(["rainbow/cartpole", "--agent.n_step", "0", "--logdir", str(tmp_path / "r")]) == 2
    assert "agent.n_step=0 must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_target_on_evaluations_is_checked_before_anything_starts(capsys, tmp_path):
    logdir = str(tmp_path / "r")
    assert main(["dqn/cartpole", "--train.target_on", "best", "--logdir", logdir]) == 2
    assert "train.target_on='best'; allowed: train, eval" in capsys.readouterr().err
    argv = ["dqn/cartpole", "--train.target_on", "eval", "--train.eval_every", "0"]
    assert main([*argv, "--logdir", logdir]) == 2
    assert "train.eval_every must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_dump_reads_back_to_the_same_config(name, tmp_path):
    config = load_config(name)
    apply_override(config, "train.target_return", "none")
    path = tmp_path / "c.toml"
    path.write_text(dump_config(config))
    again = load_config(str(path))
    assert dataclasses.asdict(again.agent) == dataclasses.asdict(config.agent)
    assert dataclasses.asdict(again.env) == dataclasses.asdict(config.env)
    assert dataclasses.asdict(again.train) == dataclasses.asdict(config.train)
    assert tomllib.loads(path.read_text())["algorithm"] == config.algorithm


def test_overrides_parse_to_the_type_of_the_key():
    config, resume = resolve(
        [
            "ppo/cartpole",
            "--agent.lr",
            "3e-4",
            "--train.total_steps=5000",
            "--agent.anneal",
            "false",
            "--agent.clip_value",
            "0.5",
            "--mode",
            "single",
            "--actors",
            "3",
            "--logdir",
            "somewhere",
            "--env.id",
            "Acrobot-v1",
        ]
    )
    assert not resume
    assert config.agent.lr == 3e-4 and isinstance(config.agent.lr, float)
    assert config.train.total_steps == 5000
    assert config.agent.anneal is False
    assert config.agent.clip_value == 0.5
    assert (config.train.actors, config.train.logdir) == (3, "somewhere")
    assert config.env.id == "Acrobot-v1"
    assert isinstance(resolve(["dqn/cartpole", "--agent.lr", "1"])[0].agent.lr, float)


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--train.total_steps", "1.5"], ["train.total_steps", "integer"]),
        (["--agent.anneal", "yes"], ["agent.anneal", "true or false"]),
        (["--agent.lr", "fast"], ["agent.lr", "number"]),
        (["--agent.learning_rate", "1e-3"], ["agent.learning_rate", "lr", "clip_coef"]),
        (["--train.steps", "10"], ["train.steps", "total_steps", "log_every"]),
        (["--model.size", "10"], ["model.size", "env, agent, train"]),
        (["--actors", "two"], ["train.actors", "integer"]),
        (["--mode", "turbo"], ["train.mode", "single"]),
        (["--backend", "dask"], ["train.backend", "xparl, ray"]),
        (["--agent.lr"], ["--agent.lr", "value"]),
        (["--train.total_steps", "0"], ["train.total_steps", "at least 1"]),
    ],
)
def test_a_bad_override_exits_before_anything_starts(argv, names, capsys, tmp_path):
    assert main(["ppo/cartpole", "--logdir", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err
    for name in names:
        assert name in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("variable", "value"), [("PARL_PRELOAD_NICE", "99"), ("PARL_HEARTBEAT_S", "abc")]
)
def test_a_bad_parl_setting_is_one_line_before_anything_starts(
    variable, value, monkeypatch, capsys, tmp_path
):
    monkeypatch.setenv(variable, value)
    assert main(["ppo/cartpole", "--logdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"parl-train: error: {variable}={value!r} is not ")
    assert err.count("\n") == 1 and "unset it for the default" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('algorithm = "PPO"\n[agent]\nlearning_rate = 1.0\n', ["agent.learning_rate", "lr"]),
        ('algorithm = "PPO"\n[train]\ntotal_steps = 1.5\n', ["train.total_steps", "integer"]),
        ('algorithm = "PPO"\n[train]\nprogress = 1\n', ["train.progress", "true or false"]),
        ('algorithm = "XYZ"\n', ["XYZ", "PPO", "DQN"]),
        ("[env]\nid = 'CartPole-v1'\n", ["algorithm"]),
        ('algorithm = "PPO"\n[model]\nx = 1\n', ["model", "[agent]"]),
        ('algorithm = "PPO"\n[train\n', ["not valid TOML"]),
    ],
)
def test_a_bad_file_is_reported_by_key(text, names, capsys, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    for name in names:
        assert name in err


def test_a_users_file_takes_the_defaults_it_leaves_out(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('algorithm = "dqn"\n[agent]\nbatch_size = 32\n[train]\nseed = 7\n')
    config = load_config(str(path))
    assert (config.algorithm, config.agent.batch_size, config.train.seed) == ("DQN", 32, 7)
    assert config.agent.gamma == 0.99


def test_unknown_configs_and_missing_arguments_are_errors(capsys):
    assert main(["nope/cartpole"]) == 2
    assert "ppo/cartpole" in capsys.readouterr().err  # the shipped names are listed
    assert main([]) == 2
    assert "--list" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="not found"):
        load_config("missing.toml")


def test_resume_takes_only_the_step_budget(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_config(load_config("ppo/cartpole")))
    config, resume = resolve(["--resume", str(run), "--train.total_steps", "123"])
    assert resume and config.train.total_steps == 123 and config.train.logdir == str(run)
    assert main(["--resume", str(run), "--agent.lr", "1"]) == 2
    assert "only --train.total_steps" in capsys.readouterr().err
    assert main(["ppo/cartpole", "--resume", str(run)]) == 2
    assert "give no config" in capsys.readouterr().err


def test_capture_video_without_the_video_extra_names_the_install_command(
    capsys, tmp_path, monkeypatch
):
    # The extra is installed where the tests run (test_train_runs records a video): hide
    # moviepy from the check, as a machine without the extra would.
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "moviepy" else find_spec(name, *args),
    )
    assert main(["ppo/cartpole", "--capture-video", "--logdir", str(tmp_path / "r")]) == 2
    assert "pip install 'parl-algos[video]'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_list_shows_every_shipped_config_with_its_modes():
    out = subprocess.run(
        [str(Path(sys.executable).with_name("parl-train")), "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == shipped_configs()
    for line in lines:
        assert "modes: single" in line


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["cql/pendulum", "--env.data_policy", "best"], ["env.data_policy", "final, medium"]),
        (["iql/pendulum", "--env.dataset", "no/such.npz"], ["env.dataset", "no such file"]),
        (["bc/pendulum", "--env.data_random", "1.5"], ["env.data_random", "[0, 1]"]),
        (["bc/pendulum", "--mode", "sync"], ["train.mode", "single"]),
        (["qmix/simple_spread", "--env.id", "simple_nothing"], ["env.id", "mpe2"]),
        (["qmix/simple_spread", "--agent.mixer", "max"], ["agent.mixer", "qmix, vdn, none"]),
        (["qmix/simple_spread", "--env.id", "simple_speaker_listener_v4"], ["env.id", "[3, 5]"]),
        (["maddpg/simple_spread", "--agent.num_envs", "0"], ["agent.num_envs", "at least 1"]),
    ],
)
def test_offline_and_multi_agent_settings_are_checked_before_anything_starts(
    argv, names, capsys, tmp_path
):
    assert main([*argv, "--logdir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in names), err
    assert not (tmp_path / "r").exists()
