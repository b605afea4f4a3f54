"""Code and files reach actors unasked; actors' output reaches the user; local clusters."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import psutil
import pytest

import parl_remote
from tests.remote.conftest import make_cluster, run_client_script, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = make_cluster(tmp_path_factory.mktemp("shipping"), workers=(2,))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def module_cluster(cluster):
    """The cluster that `connected` joins: this module's."""
    return cluster


@parl_remote.remote_class
class Talker:
    def talk(self, text):
        print(text, flush=True)
        print("a warning line", file=sys.stderr, flush=True)
        return "ok"


def test_actor_output_is_echoed_here_with_its_id(connected, capfd):
    talker = Talker()
    assert talker.talk("hello from the actor") == "ok"
    prefix = f"(Talker {talker._parl_ref.actor_id}"  # Ray's prefix goes on: " pid=N)"
    seen = []

    def echoed():
        out, err = capfd.readouterr()
        seen.append(out + err)
        lines = "".join(seen).splitlines()
        texts = ("hello from the actor", "a warning line")
        return all(any(prefix in line and text in line for line in lines) for text in texts)

    wait_until(echoed, 30, 0.1, "the actor's output echoed here")


def _project(root):
    (root / "mylib").mkdir()
    (root / "mylib" / "__init__.py").write_text("")
    (root / "mylib" / "util.py").write_text("def helper(x):\n    return x * 10\n")
    (root / "mylib" / "models.py").write_text(
        "from mylib.util import helper\n\n\nclass Net:\n    def forward(self, x):\n        "
        "return helper(x) + 1\n"
    )
    (root / "data").mkdir()
    np.save(root / "data" / "a.npy", np.arange(3))
    np.save(root / "data" / "b.npy", np.arange(2))
    (root / "data" / "skip.txt").write_text("not matched by data/*.npy")
    (root / "configs" / "sub").mkdir(parents=True)
    (root / "configs" / "c.txt").write_text("top")
    (root / "configs" / "sub" / "d.txt").write_text("nested")


@pytest.mark.xparl_only  # a script joins the xparl cluster (test_ray.py ships modules on Ray)
def test_main_classes_user_modules_and_distributed_files_reach_the_actor(cluster, tmp_path):
    _project(tmp_path)
    result = run_client_script(
        f"""
        import os
        import numpy as np
        import parl
        from mylib.models import Net

        parl.connect({cluster.address!r}, distributed_files=["data/*.npy", "configs/"])

        @parl.remote_class
        class Actor:                      # defined in the script itself
            def run(self):
                return (
                    Net().forward(3),
                    np.load("data/a.npy").tolist(),
                    sorted(os.listdir("data")),
                    open("configs/sub/d.txt").read(),
                    os.getcwd() != {str(tmp_path)!r},
                )

        RemoteNet = parl.remote_class(Net)   # a class of the user's own module
        print("RESULT", Actor().run(), RemoteNet().forward(2))
        """,
        cluster,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "RESULT (31, [0, 1, 2], ['a.npy', 'b.npy'], 'nested', True) 21" in result.stdout


@pytest.mark.xparl_only  # a script joins the xparl cluster
def test_a_pattern_that_matches_nothing_fails_at_connect(cluster, tmp_path):
    result = run_client_script(
        f"""
        import parl
        try:
            parl.connect({cluster.address!r}, distributed_files=["missing/*.bin"])
        except ValueError as exc:
            print("ValueError:", exc)
        """,
        cluster,
        cwd=tmp_path,
    )
    assert "ValueError: distributed_files: 'missing/*.bin' matches no file" in result.stdout


@pytest.mark.xparl_only  # the echo's path through xparl's master to a script
def test_actor_output_is_echoed_with_its_id(cluster, tmp_path):
    result = run_client_script(
        f"""
        import sys, time
        import parl
        parl.connect({cluster.address!r})

        @parl.remote_class
        class Talker:
            def talk(self):
                print("hello from the actor")
                print("a warning line", file=sys.stderr)
                return "ok"

        t = Talker()
        print("ID", t._parl_ref.actor_id, t.talk(), flush=True)
        time.sleep(1.0)  # the lines travel actor -> worker -> master -> here
        """,
        cluster,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    actor_id = re.search(r"ID (\w+) ok", result.stdout).group(1)
    assert f"(Talker {actor_id}) hello from the actor" in result.stdout
    assert f"(Talker {actor_id}) a warning line" in result.stderr


@pytest.mark.xparl_only  # a script joins the xparl cluster
def test_log_to_driver_false_keeps_the_terminal_quiet(cluster, tmp_path):
    result = run_client_script(
        f"""
        import time, parl
        parl.connect({cluster.address!r}, log_to_driver=False)

        @parl.remote_class
        class Talker:
            def talk(self):
                print("should not be echoed")

        Talker().talk()
        time.sleep(0.5)
        """,
        cluster,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "should not be echoed" not in result.stdout


LOCAL_CLUSTER = """
import os, sys, time
import parl

client = parl.connect(cpu_num=2)

@parl.remote_class
class A:
    def pid(self):
        return os.getpid()

a, b = A(), A()
status = client.status()
print("PIDS", client.cluster.master.pid, client.cluster.worker.pid, a.pid(), b.pid(), flush=True)
print("SLOTS", status["totals"]["cpu_total"], status["totals"]["cpu_used"], flush=True)
if sys.argv[1] == "hang":
    time.sleep(120)
"""


@pytest.mark.xparl_only  # xparl's local cluster
@pytest.mark.parametrize("ending", ["exit", "kill"])
def test_connect_without_address_starts_a_local_cluster_owned_by_the_process(tmp_path, ending):
    script = tmp_path / "local.py"
    script.write_text(textwrap.dedent(LOCAL_CLUSTER))
    proc = subprocess.Popen(
        [sys.executable, str(script), "hang" if ending == "kill" else "exit"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()[1:]]
        assert proc.stdout.readline().split() == ["SLOTS", "2", "2"]
        assert len(pids) == 4
        if ending == "kill":  # (an exiting script may already be stopping its cluster)
            assert all(psutil.pid_exists(p) for p in pids)
        if ending == "kill":
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        wait_until(
            lambda: (
                not any(
                    psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids
                )
            ),
            timeout=15,
            what="the local cluster's processes to end with their owner",
        )
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.xparl_only  # xparl's local cluster
def test_a_second_connect_with_other_arguments_is_an_error(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import glob, os, parl
                first = parl.connect(cpu_num=2)
                assert parl.connect() is first and parl.connect(cpu_num=1) is first
                logdir = first.cluster.logdir
                try:
                    parl.connect(cpu_num=3)
                except parl.RemoteError as exc:
                    print("ERROR", exc)
                parl.disconnect()
                print("LOGS LEFT", os.path.exists(logdir))
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "ERROR already connected to 127.0.0.1:" in result.stdout
    assert "(a local cluster of 2 slots); call parl.disconnect() first" in result.stdout
    assert "LOGS LEFT False" in result.stdout


SOURCE_CHECKOUT = """
    import os, sys
    import parl  # from PYTHONPATH: a source checkout, not installed here

    assert "parl.utils" not in sys.modules

    @parl.remote_class
    class Probe:
        def files(self):
            import parl.utils.machine_info  # a module this client never imported

            return parl.__file__, parl.utils.machine_info.__file__, os.getcwd()

    parl.connect(os.environ["ADDRESS"])
    print(repr(Probe().files()))
"""


def test_parl_from_pythonpath_ships_whole(tmp_path):
    """A client whose `parl` comes from a source checkout on PYTHONPATH, in an environment
    where it is not installed, on a worker in such an environment too: the actor imports
    parl's modules from what was shipped, those the client never imported among them."""
    import ast
    import shutil

    from tests.conftest import REPO_ROOT, python_without

    python = python_without(tmp_path / "env", [parl_remote])
    checkout = tmp_path / "checkout"
    shutil.copytree(f"{REPO_ROOT}/packages/parl-core/src", checkout)
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    missing = subprocess.run([python, "-c", "import parl"], env=bare, capture_output=True)
    assert b"No module named 'parl'" in missing.stderr  # not importable there otherwise
    cluster = make_cluster(tmp_path, workers=())
    worker = subprocess.Popen(
        [
            python,
            "-m",
            "parl_remote.worker._worker",
            "--address",
            cluster.address,
            "--cpu_num",
            "1",
        ],
        env=dict(cluster.env, PYTHONPATH=""),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        wait_until(lambda: cluster.status()["totals"]["workers"] == 1, what="the worker")
        env = dict(cluster.env, PYTHONPATH=str(checkout), ADDRESS=cluster.address)
        done = subprocess.run(
            [python, "-c", textwrap.dedent(SOURCE_CHECKOUT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        parl_file, machine_info, cwd = ast.literal_eval(done.stdout.strip().splitlines()[-1])
        assert parl_file == os.path.join(cwd, "parl", "__init__.py")
        assert machine_info == os.path.join(cwd, "parl", "utils", "machine_info.py")
    finally:
        worker.kill()
        worker.wait(10)
        cluster.stop()
