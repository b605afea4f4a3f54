"""`import parl`: the lazy facade, its aliases, and the rule that it never imports torch."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import run_python


def test_core_names_resolve():
    import parl
    from parl._agent import Agent
    from parl._algorithm import Algorithm
    from parl._model import Model

    assert parl.Model is Model
    assert parl.Algorithm is Algorithm
    assert parl.Agent is Agent
    assert parl.utils.ReplayMemory.__name__ == "ReplayMemory"
    assert callable(parl.utils.logger.info)
    assert callable(parl.utils.summary.add_scalar)
    assert callable(parl.utils.machine_info.get_cpu_count)
    assert {"Model", "Algorithm", "Agent", "utils", "remote_class", "connect"} <= set(dir(parl))


def test_unknown_name_is_an_attribute_error():
    import parl

    with pytest.raises(AttributeError, match="no attribute 'Modle'"):
        _ = parl.Modle
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = parl.utils.nope


def test_algorithms_and_evo_are_the_sibling_modules():
    import parl
    import parl.algorithms
    import parl_algos
    import parl_evo
    from parl.algorithms import PolicyGradient

    assert parl.algorithms is parl_algos
    assert PolicyGradient is parl_algos.PolicyGradient
    assert parl.evo is parl_evo


def test_import_parl_and_parl_remote_never_import_torch():
    code = textwrap.dedent(
        """
        import sys
        import parl, parl_remote
        parl.utils.logger, parl.utils.summary, parl.utils.ReplayMemory
        parl.utils.machine_info.get_gpu_count()
        heavy = sorted(m for m in ("torch", "parl_algos", "gymnasium") if m in sys.modules)
        print("imported:", heavy)
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "imported: []" in result.stdout


@pytest.mark.parametrize(
    ("blocked", "name", "dist"),
    [
        ("parl_algos", "algorithms", "parl-algos"),
        ("parl_evo", "evo", "parl-evo"),
        ("parl_remote", "remote_class", "parl-remote"),
        ("parl_remote", "connect", "parl-remote"),
    ],
)
def test_missing_sibling_says_what_to_install(blocked, name, dist):
    # `sys.modules[name] = None` makes `import name` fail exactly as if it were not installed.
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules[{blocked!r}] = None
        import parl
        try:
            parl.{name}
        except ImportError as exc:
            print("ImportError:", exc)
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert f"pip install {dist}" in result.stdout
    assert f"parl.{name}" in result.stdout


def test_import_parl_algorithms_statement_reports_missing_sibling():
    code = "import sys; sys.modules['parl_algos'] = None\nimport parl.algorithms"
    result = run_python(code)
    assert result.returncode != 0
    assert "pip install parl-algos" in result.stderr
