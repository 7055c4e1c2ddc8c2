"""Shared fixtures: tiny random HookedTransformers with the embedded model's architecture; the embedded model itself,
loaded once per session (``embedded_model``, for integration tests); the rules for tests that need the benchmark
files of ``../shared/data`` (``needs_shared_data``) and for those that drive a browser (marker ``browser``)."""
import importlib.util
import os
import shutil
from pathlib import Path

import pytest
import torch

import reach_lens  # noqa: F401  (before transformer_lens: marks broken optional wheels absent, reach_lens.wheels)
from transformer_lens import HookedTransformer, HookedTransformerConfig

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared/data beside the checkout


def in_ci() -> bool:
    """True when the environment says CI (``CI=true``, as GitHub Actions, GitLab and most runners set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_or_fail_in_ci(message: str) -> None:
    """Skip the calling test for what ``message`` says is missing; under CI (``CI=true``) fail it instead: CI must not
    pass by skipping."""
    if in_ci():
        pytest.fail(f"{message} (CI=true: what is missing fails the test instead of skipping it)", pytrace=False)
    pytest.skip(message)


def require_shared_data(*paths: str, root: Path | None = None) -> Path:
    """``root`` (default ``SHARED_DATA``) if it and every ``paths`` under it exist. Otherwise the calling
    test is skipped, or, under CI (``CI=true``), FAILS: CI must not pass by skipping the real-data tests."""
    root = SHARED_DATA if root is None else root
    missing = [str(root / p) for p in paths if not (root / p).exists()] if root.is_dir() else [str(root)]
    if missing:
        skip_or_fail_in_ci(f"needs the benchmark files of ../shared/data: missing {', '.join(missing)}")
    return root


needs_shared_data = pytest.mark.needs_shared_data
"""Marker: ``@needs_shared_data`` (the directory) or ``@needs_shared_data("arc/ARC-Easy-test.jsonl", ...)``
(files under it): the test is skipped when they are missing, and fails under ``CI=true``."""


CHROMIUM = os.environ.get("REACH_LENS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def require_browser() -> str:
    """The Chromium the ``browser`` tests drive through Playwright (``CHROMIUM``: Debian's ``chromium``, or
    ``$REACH_LENS_CHROMIUM``), if it and Playwright for Python are installed. Otherwise the calling test is skipped,
    or, under CI (``CI=true``), FAILS: CI must not pass by skipping the browser tests."""
    missing = [] if importlib.util.find_spec("playwright") else ["Playwright for Python (pip install -e '.[dev]')"]
    missing += [] if Path(CHROMIUM).is_file() else [f"Chromium at {CHROMIUM} (apt-get install chromium)"]
    if missing:
        skip_or_fail_in_ci(f"needs a browser: missing {' and '.join(missing)}")
    return CHROMIUM


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_shared_data(*paths): needs ../shared/data (and these files under it); "
        "skipped when missing, failed under CI=true"
    )


def pytest_collection_modifyitems(config, items):
    """The ``heavy`` tests first, longest first, each followed by one short test: on parallel workers that are sent
    one test at a time (``--maxschedchunk=1``), the longest tests start at once on different workers and the short
    ones fill in around them, instead of one worker running a long test last while the other waits."""
    heavy = sorted((i for i in items if i.get_closest_marker("heavy")), key=lambda i: -i.get_closest_marker("heavy").args[0])
    short = [i for i in items if not i.get_closest_marker("heavy")]
    order = []
    for item in heavy:
        order += [item, *short[:1]]
        short = short[1:]
    items[:] = order + short


def pytest_runtest_setup(item):
    for marker in item.iter_markers("needs_shared_data"):
        require_shared_data(*marker.args)
    if item.get_closest_marker("browser"):
        require_browser()


def tiny_config(n_layers: int = 4, d_vocab: int = 50, seed: int = 0) -> HookedTransformerConfig:
    """A Llama-shaped config (RMS norm, rotary, gated SiLU MLP, grouped KV heads), small enough for unit tests."""
    return HookedTransformerConfig(
        n_layers=n_layers,
        d_model=32,
        d_head=8,
        n_heads=4,
        n_key_value_heads=2,
        d_mlp=64,
        d_vocab=d_vocab,
        n_ctx=128,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=8,
        gated_mlp=True,
        final_rms=True,
        seed=seed,
        init_weights=True,
        device="cpu",
    )


def make_tiny_model(n_layers: int = 4, d_vocab: int = 50, seed: int = 0) -> HookedTransformer:
    """A random model whose weights are scaled up so that interventions visibly change its outputs."""
    torch.manual_seed(seed)
    model = HookedTransformer(tiny_config(n_layers, d_vocab, seed))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("W_in", "W_out", "W_gate", "W_Q", "W_K", "W_V", "W_O")):
                p.mul_(4.0)
    model.eval()
    return model


# Under pytest-xdist (`-n 2`) each worker is one process of a CPU's worth: torch in it, and every process it starts
# (the scripts the CLI tests run, Ray's workers), use one thread, so that two workers never share two cores four ways.
PARALLEL_WORKER = "PYTEST_XDIST_WORKER" in os.environ
if PARALLEL_WORKER:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"


@pytest.fixture(autouse=True)
def one_thread_for_unit_tests(request):
    """Tiny-model ops gain nothing from a second thread, and on a busy 2-core machine it can stall every op
    (measured ~100x); integration tests on the embedded model keep torch's own thread count unless the suite runs
    on parallel workers. Either way the count is restored afterwards (an experiment run with --threads sets it
    process-wide)."""
    threads = torch.get_num_threads()
    if PARALLEL_WORKER or not request.node.get_closest_marker("integration"):
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_model() -> HookedTransformer:
    return make_tiny_model()


@pytest.fixture(scope="session")
def embedded_model() -> HookedTransformer:
    """The embedded SmolLM2-135M-Instruct, loaded once for the whole session. Tests must not edit it in place (the
    planted controls and SAE attachment work on copies or on new models sharing its tensors); the engine's prefix
    cache it carries is reused across tests, which changes no result."""
    from reach_lens.models import load_model

    return load_model()


def legends_off_data(fig) -> bool:
    """No legend of a drawn (saved) matplotlib figure overlaps the data area of any of its axes."""
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    frames = [ax.get_window_extent(renderer) for ax in fig.axes]
    return all(not legend.get_window_extent(renderer).overlaps(frame) for legend in legends for frame in frames)
