"""The notebooks under examples/notebooks/ run top to bottom in a real Jupyter kernel."""

from __future__ import annotations

import importlib.util
import os

from tests.conftest import REPO_ROOT

NOTEBOOK = os.path.join(REPO_ROOT, "examples", "notebooks", "remote_actors.ipynb")


def _outputs(cell) -> str:
    return "\n".join(
        str(out.get("data", {}).get("text/plain", out.get("text", ""))) for out in cell.outputs
    )


def test_remote_actors_notebook_runs_a_class_defined_in_a_cell(tmp_path):
    for name in ("nbformat", "nbclient", "ipykernel"):  # parl-core's test extra
        assert importlib.util.find_spec(name), f"run the set-up (make setup): {name} is missing"
    import nbclient
    import nbformat

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,  # a cell's bound: a local cluster starting on a loaded machine
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert not [out for cell in cells for out in cell.outputs if out.output_type == "error"]
    shown = [_outputs(cell) for cell in cells]
    assert "15" in shown  # the blocking call on an actor of a class defined in a cell
    assert "[16, 17, 18]" in shown  # the awaited calls, from the kernel's event loop
    assert "(200, 8)" in shown  # a sampler's batch, the agent a class of the notebook too
    assert "True" in shown  # random search raised the mean return
    images = [out for cell in cells for out in cell.outputs if "image/png" in out.get("data", {})]
    assert len(images) == 1  # the curve
