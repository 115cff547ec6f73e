"""What runs and measures code, knowing nothing of operators: the lowest layer of kdsl.

* :mod:`kdsl.runtime.workers` — the isolated worker pool with hard timeouts;
* :mod:`kdsl.runtime.timing` — the one timing helper and the machine-wide latency slot;
* :mod:`kdsl.runtime.cpu` and :mod:`kdsl.runtime.gpu` — the target machine's description;
* :mod:`kdsl.runtime.cuda_launch` — the CuPy launcher of CUDA kernel bundles;
* :mod:`kdsl.runtime.storage` — the one SQLite layer every store opens its file through;
* :mod:`kdsl.runtime.progress` — progress display.

Modules here import the standard library, numpy, psutil and the error family
(:mod:`kdsl.lang.errors`) only; torch and CuPy are imported on first use, never TVM. This package
imports none of its modules, so ``import kdsl.runtime`` is free.
"""
