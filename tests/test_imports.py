"""What ``import reach_lens`` loads: no plotting stack (matplotlib comes in where a figure is drawn or saved), and what
it defers still loads when used."""
import subprocess
import sys

from reach_lens.runs import publish


def test_import_reach_lens_leaves_matplotlib_and_the_plots_unloaded():
    probe = ("import sys, reach_lens; print(sorted(m for m in sys.modules "
             "if m.partition('.')[0] == 'matplotlib' or m.startswith('reach_lens.plots')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_publish_saves_each_figure_and_copies_it_under_the_same_name(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    target = tmp_path / "run" / "summary" / "curve.png"
    assert publish(tmp_path / "figures", {target: fig}) == [target]
    saved = target.read_bytes()
    assert saved.startswith(b"\x89PNG\r\n\x1a\n")
    assert (tmp_path / "figures" / "curve.png").read_bytes() == saved
