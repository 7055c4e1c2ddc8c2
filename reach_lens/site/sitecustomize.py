"""Marks the modules named in ``$REACH_LENS_ABSENT_MODULES`` (comma-separated) absent in this interpreter.

``reach_lens.wheels.hide_broken_wheels`` puts this directory on ``PYTHONPATH`` for the Python processes a process
starts (vLLM's engine core and model inspection run in interpreters of their own) when a wheel is installed but
cannot be imported (PyPI's CUDA builds of torchvision, torchaudio and torchcodec beside a CPU torch): a module set
to None in ``sys.modules`` is one that ``importlib.util.find_spec`` reports missing, so transformers and vLLM take
their paths without it instead of failing on its import.
"""
import os
import sys

for _name in filter(None, os.environ.get("REACH_LENS_ABSENT_MODULES", "").split(",")):
    sys.modules.setdefault(_name, None)
