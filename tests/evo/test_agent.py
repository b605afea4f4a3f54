"""ESAgent: EvoKit's workflow over numpy vectors and torch modules, config files, solver files."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from parl_evo import (
    ConfigError,
    ESAgent,
    ESConfig,
    FutureSampleError,
    NoiseTable,
    SamplingInfo,
    SolverStateError,
)
from tests.conftest import run_python
from tests.evo.conftest import sphere

EVOKIT_TOML = """
seed = 1024

[solver]
type = "basic_es"

[gaussian_sampling]
std = 0.5
cached = true
cache_size = 100000

[optimizer]
type = "Adam"
base_lr = 0.05
momentum = 0.9
beta1 = 0.9
beta2 = 0.999
epsilon = 1e-08

[async_es]
max_staleness = 2
"""


def config(kind="BASIC_ES", **sections):
    data = {
        "seed": 3,
        "solver": {"type": kind, "population_size": 10},
        "gaussian_sampling": {"std": 0.1},
        "optimizer": {"type": "adam", "base_lr": 0.05},
    }
    for name, fields in sections.items():
        data[name] = {**data.get(name, {}), **fields}
    return ESConfig.from_dict(data)


def linear_policy(weights, obs):
    return float(weights @ obs)


def run_generation(agent, sampler, f=sphere):
    infos = [sampler.add_noise() for _ in range(agent.population_size)]
    rewards = [-f(agent.solver.candidate(info)) for info in infos]
    return agent.update(infos, rewards)


def test_config_from_evokit_style_toml(tmp_path):
    path = tmp_path / "es.toml"
    path.write_text(EVOKIT_TOML)
    cfg = ESConfig.from_file(path)
    assert cfg.seed == 1024
    assert cfg.solver.type == "BASIC_ES"
    assert cfg.optimizer.type == "ADAM" and cfg.optimizer.base_lr == 0.05
    assert cfg.gaussian_sampling.cached and cfg.gaussian_sampling.cache_size == 100_000
    assert cfg.async_es.max_staleness == 2
    assert ESConfig.from_dict(cfg.to_dict()) == cfg


def test_config_yaml(tmp_path):
    path = tmp_path / "es.yaml"
    path.write_text("seed: 5\noptimizer:\n  type: SGD\n  base_lr: 1e-02\n")
    try:
        import yaml  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(ConfigError, match="needs PyYAML .`pip install pyyaml`.; or write"):
            ESConfig.from_file(path)
    else:
        cfg = ESConfig.from_file(path)
        assert (cfg.seed, cfg.optimizer.type, cfg.optimizer.base_lr) == (5, "SGD", 0.01)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"sead": 1}, "unknown field sead; the fields of the top level are"),
        ({"optimizer": {"lr": 1}}, "unknown field optimizer.lr; the fields of optimizer are"),
        ({"solver": {"type": "PPO"}}, "solver.type='PPO' is not one of"),
        ({"optimizer": {"type": "rmsprop"}}, "optimizer.type='rmsprop' is not one of"),
        ({"gaussian_sampling": {"std": -1}}, "gaussian_sampling.std=-1.0 must be positive"),
        ({"gaussian_sampling": {"cached": "yes"}}, "cached='yes' must be true or false"),
        ({"solver": {"population_size": 2.5}}, "population_size=2.5 must be an integer"),
        ({"async_es": 3}, "async_es must be a table of fields"),
    ],
)
def test_config_errors_name_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        ESConfig.from_dict(data, source="es.toml")


def test_numpy_workflow_clone_mirrored_noise_and_update():
    agent = ESAgent(config(), model=np.full(4, 1.0), policy=linear_policy)
    sampler = agent.clone()
    first, second, third = sampler.add_noise(), sampler.add_noise(), sampler.add_noise()
    assert (first.key, first.sign) == (second.key, 1) and second.sign == -1
    assert third.key != first.key and first.version == 0
    np.testing.assert_array_equal(sampler.weights, agent.solver.candidate(third))
    assert sampler.predict(np.ones(4)) == pytest.approx(float(sampler.weights.sum()))
    assert agent.predict(np.ones(4)) == 4.0  # the original acts with the unperturbed mean
    start = sphere(agent.get_weights())
    for _ in range(60):
        stats = run_generation(agent, sampler)
    assert stats.version == 60 and stats.used == 10
    assert sphere(agent.get_weights()) < start / 20
    np.testing.assert_array_equal(agent.weights, agent.get_weights())
    with pytest.raises(SolverStateError, match="cloned sampling agent cannot update"):
        sampler.update([first], [1.0])


def test_clones_draw_reproducible_distinct_keys():
    a = ESAgent(config(), model=np.zeros(3))
    b = ESAgent(config(), model=np.zeros(3))
    keys = [[c.add_noise().key for _ in range(4)] for c in (a.clone(), a.clone())]
    assert keys[0] != keys[1]
    assert [[c.add_noise().key for _ in range(4)] for c in (b.clone(), b.clone())] == keys
    other = ESAgent(config(), model=np.zeros(3), sampler_id=1)
    assert other.add_noise().key != ESAgent(config(), model=np.zeros(3)).add_noise().key


def test_torch_module_is_flattened_perturbed_and_restored():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)  # tiny nets; xdist workers share two cores
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    flat = torch.nn.utils.parameters_to_vector(net.parameters()).detach().double().numpy()
    agent = ESAgent(config(solver={"population_size": 8}), model=net)
    np.testing.assert_array_equal(agent.get_weights(), flat)
    assert agent.model is net and agent.solver.dim == 3 * 4 + 4 + 4 * 2 + 2
    sampler = agent.clone()
    assert sampler.model is not net
    info = sampler.add_noise()
    noisy = torch.nn.utils.parameters_to_vector(sampler.model.parameters()).detach().numpy()
    np.testing.assert_array_equal(noisy, agent.solver.candidate(info).astype(np.float32))
    obs = np.ones((5, 3), dtype=np.float32)
    out = sampler.predict(obs)
    assert isinstance(out, np.ndarray) and out.shape == (5, 2)
    with torch.no_grad():
        np.testing.assert_allclose(out, sampler.model(torch.ones(5, 3)).numpy())
    infos = [sampler.add_noise() for _ in range(8)]
    agent.update(infos, np.arange(8.0))
    after = torch.nn.utils.parameters_to_vector(net.parameters()).detach().numpy()
    np.testing.assert_array_equal(after, agent.get_weights().astype(np.float32))
    # load_weights from another module of the same architecture
    other = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    agent.load_weights(other)
    assert agent.solver.version == 0
    np.testing.assert_array_equal(
        agent.get_weights(),
        torch.nn.utils.parameters_to_vector(other.parameters()).detach().double().numpy(),
    )
    with pytest.raises(ValueError, match="got 3 weights, the model has 26"):
        agent.load_weights(np.zeros(3))


def test_import_parl_evo_never_imports_torch():
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import parl.evo
        agent = parl.evo.ESAgent({"seed": 1}, model=np.zeros(5), policy=lambda w, o: w @ o)
        agent.clone().add_noise()
        print("torch" in sys.modules)
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]


def test_agent_without_weights_says_what_to_do():
    agent = ESAgent(config())
    with pytest.raises(SolverStateError, match="pass model= to ESAgent.*load_weights"):
        agent.add_noise()
    agent.load_weights(np.zeros(2))
    assert agent.solver.dim == 2
    with pytest.raises(TypeError, match="needs a policy for a numpy weight vector"):
        agent.predict(np.zeros(2))
    with pytest.raises(TypeError, match="numpy vector of weights or a torch nn.Module"):
        ESAgent(config(), model="weights.bin")


@pytest.mark.parametrize(
    ("solver", "extra"),
    [
        ("BASIC_ES", {"async_es": {"max_staleness": 2, "staleness_decay": 0.7}}),
        ("BASIC_ES", {"optimizer": {"type": "momentum"}}),
        ("CMA_ES", {}),
        ("SEP_CMA_ES", {}),
        ("BASIC_GA", {"solver": {"elites": 2}}),
    ],
)
def test_save_load_solver_continues_bit_for_bit(tmp_path, solver, extra):
    cfg = config(solver, **extra)
    x0 = np.linspace(-1, 1, 6)

    def generations(agent, count):
        weights = []
        for _ in range(count):
            infos = [agent.add_noise() for _ in range(agent.population_size)]
            agent.update(infos, [-sphere(agent.solver.candidate(i)) for i in infos])
            weights.append(agent.get_weights().tobytes())
        return weights

    straight = ESAgent(cfg, model=x0)
    generations(straight, 5)
    straight.add_noise()  # leave a mirrored twin pending: it must survive the round trip
    path = tmp_path / "solver.npz"
    straight.save_solver(path)
    expected = generations(straight, 6)

    resumed = ESAgent(cfg, model=np.zeros(6))
    resumed.load_solver(path)
    assert resumed.solver.version == 5
    assert generations(resumed, 6) == expected


def test_load_solver_refuses_a_file_of_another_run(tmp_path):
    path = tmp_path / "solver.npz"
    ESAgent(config("CMA_ES"), model=np.zeros(4)).save_solver(path)
    with pytest.raises(SolverStateError, match="type='CMA_ES'.*make solver.type match"):
        ESAgent(config(), model=np.zeros(4)).load_solver(path)
    with pytest.raises(SolverStateError, match="dim=4.*make the model match"):
        ESAgent(config("CMA_ES"), model=np.zeros(5)).load_solver(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(SolverStateError, match="is not a solver file written by save_solver"):
        ESAgent(config(), model=np.zeros(4)).load_solver(tmp_path / "junk.npz")


def test_cached_noise_agent_uses_the_shared_table(noise_dir):
    cfg = config(gaussian_sampling={"cached": True, "cache_size": 5000})
    with ESAgent(cfg, model=np.zeros(100), noise_directory=noise_dir) as agent:
        assert isinstance(agent.noise, NoiseTable) and agent.noise.seed == cfg.seed
        info = agent.add_noise()
        assert 0 <= info.key <= 4900
        np.testing.assert_array_equal(
            agent.weights, 0.1 * agent.noise.table[info.key : info.key + 100].astype(np.float64)
        )
    too_small = config(gaussian_sampling={"cached": True, "cache_size": 50})
    with pytest.raises(ConfigError, match="cache_size to at least 100"):
        ESAgent(too_small, model=np.zeros(100), noise_directory=noise_dir).add_noise()


def test_async_samples_from_a_slow_sampler_still_count():
    cfg = config(async_es={"max_staleness": 1}, solver={"population_size": 4})
    agent = ESAgent(cfg, model=np.full(3, 1.0))
    slow, fast = agent.clone(), agent.clone()
    late = [slow.add_noise(), slow.add_noise()]  # drawn around version 0
    infos = [fast.add_noise() for _ in range(4)]
    agent.update(infos, [-sphere(agent.solver.candidate(i)) for i in infos])  # -> version 1
    infos = [fast.add_noise() for _ in range(4)]
    assert {i.version for i in infos} == {1}
    stats = agent.update(infos + late, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert (stats.used, stats.discarded) == (6, 0)  # one version old: corrected and used
    stats = agent.update([fast.add_noise() for _ in range(4)] + late, np.arange(6.0))
    assert (stats.used, stats.discarded) == (4, 2)  # two versions old: discarded
    # A pending mirrored twin from an old version is dropped, not sent stale.
    slow.add_noise()
    agent.update([fast.add_noise() for _ in range(4)], np.arange(4.0))
    assert slow.add_noise().version == agent.solver.version
    with pytest.raises(FutureSampleError, match="replica that drew it is ahead"):
        ESAgent(cfg, model=np.full(3, 1.0)).update([SamplingInfo(1, 1, 3)] * 2, [0.0, 1.0])


def test_replica_told_the_same_samples_has_the_same_weights():
    # Only infos and rewards cross the process boundary; the replica rebuilds everything.
    cfg = config(solver={"population_size": 6})
    agent = ESAgent(cfg, model=np.linspace(0, 1, 50))
    sampler = agent.clone()
    rounds = []
    for _ in range(3):
        infos = [sampler.add_noise() for _ in range(6)]
        rewards = [-sphere(agent.solver.candidate(i)) for i in infos]
        agent.update(infos, rewards)
        rounds.append(([(i.key, i.sign, i.version) for i in infos], rewards))
    code = textwrap.dedent(
        f"""
        import hashlib
        import numpy as np
        from parl_evo import ESAgent, ESConfig, SamplingInfo
        agent = ESAgent(ESConfig.from_dict({cfg.to_dict()!r}), model=np.linspace(0, 1, 50))
        for infos, rewards in {rounds!r}:
            agent.update([SamplingInfo(*i) for i in infos], rewards)
        print(hashlib.sha256(agent.get_weights().tobytes()).hexdigest())
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    import hashlib

    assert result.stdout.strip() == hashlib.sha256(agent.get_weights().tobytes()).hexdigest()


def test_the_guides_example_runs(tmp_path, monkeypatch, repo_root):
    with open(f"{repo_root}/docs/es.md", encoding="utf-8") as f:
        code = f.read().split("```python", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/es.md", "exec"), namespace)
    agent = namespace["agent"]
    assert agent.solver.version == 100
    assert sphere(agent.get_weights()) < 1.0  # from 90 at the start
    assert (tmp_path / "solver.npz").exists()
