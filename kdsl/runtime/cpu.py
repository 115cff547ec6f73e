"""One description of the CPU that kernels are compiled for: what every schedule decision reads.

The default schedule, the schedule space's heuristic, the tuners' models (Gensor's benefit formulas,
ALT's features) and the benchmarks' "percent of peak" all take the machine from here, never from
constants: a register tile sized for AVX-512's 32 registers of 16 floats spills on an AVX2 machine's
16 registers of 8 floats.

Where each fact comes from:

* **the instruction set** (vector width, number of vector registers, FMA): LLVM's target features
  for the target's ``mcpu`` (``avx512f``: 512-bit vectors and 32 registers; ``avx``/``avx2``:
  256-bit and 16; else 128-bit SSE and 16), read through TVM by
  :func:`kdsl.codegen.tvm.machine.current_machine` (this module imports no TVM and takes the
  features as given). The target's ``mcpu`` is the host's, or the one named by
  ``--mcpu`` / ``KDSL_MCPU``: an AVX-512 machine runs AVX2 code, so ``--mcpu haswell`` measures the
  AVX2 case on either kind of machine.
* **FMA units per core**: LLVM does not say. :data:`FMA_UNITS` gives, per LLVM cpu name, the vector
  FMAs a core starts per cycle at that name's full vector width (Zen 4: one 512-bit FMA, as two
  256-bit halves; Zen 5 and the Xeons: two); a name it lacks gets two when the target has FMA, one
  otherwise. A host whose model name says it is a Xeon has two whatever client core LLVM calls it (a
  cloud VM reports a Sapphire Rapids Xeon as ``rocketlake``).
* **cores**: the target's ``num-cores`` (``TVM_NUM_THREADS``).
* **clock and caches**: the host's (``/sys/devices/system/cpu``, ``/proc/cpuinfo``), which is where
  the code runs whatever ``mcpu`` it was compiled for; defaults where they cannot be read.
* **the last-level cache's bandwidth** (bytes a core reads from L3 per cycle): not in sysfs;
  :func:`l3_bytes_per_cycle_of` gives it by vendor, from the host's model name (else the ``mcpu``).

>>> m = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0)
>>> m.isa, m.lanes(), m.vector_registers, m.fma_units, round(m.peak_gflops())
('avx2', 8, 16, 2, 192)
>>> from_features("skylake-avx512", {"avx2", "fma", "avx512f"}, cores=2, ghz=2.0).lanes("float32")
16
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "FMA_UNITS",
    "ONE_FMA_UNIT",
    "Machine",
    "dtype_bits",
    "fma_units_of",
    "from_features",
    "host_caches",
    "host_ghz",
    "host_model",
    "l3_bytes_per_cycle_of",
]


def dtype_bits(dtype: str) -> int:
    """The width in bits of one element of ``dtype`` (a TVM or NumPy name; 32 when it names none).

    >>> dtype_bits("float64"), dtype_bits("float16")
    (64, 16)
    """
    return int("".join(c for c in str(dtype) if c.isdigit()) or 32)


#: LLVM cpu name -> vector FMAs one core starts per cycle at that name's full vector width (512 bits
#: where it has AVX-512, else 256, else 128), from the vendors' optimization manuals. The widths matter:
#: a core whose FMA pipes are narrower than its vectors splits each FMA into halves that take both pipes.
FMA_UNITS: dict[str, int] = {
    # AMD
    "bdver1": 1,  # Bulldozer: two 128-bit FMACs per module, shared by its two cores (1 flatters a busy module)
    "bdver2": 1,  # Piledriver: as Bulldozer
    "bdver3": 1,  # Steamroller: as Bulldozer
    "bdver4": 1,  # Excavator: as Bulldozer
    "btver2": 1,  # Jaguar: no FMA; one 128-bit multiply and one add pipe
    "znver1": 1,  # Zen 1: two 128-bit FMA pipes, so a 256-bit FMA takes both
    "znver2": 2,  # Zen 2: two 256-bit FMA pipes
    "znver3": 2,  # Zen 3: two 256-bit FMA pipes
    "znver4": 1,  # Zen 4: two 256-bit FMA pipes; a 512-bit FMA is executed as two halves, one per cycle
    "znver5": 2,  # Zen 5 (server and desktop): two full 512-bit FMA pipes (the mobile parts' 256-bit
    # datapath halves that, and LLVM calls them znver5 as well: an assumed peak 2x too high there)
    # Intel client cores with AVX-512: ports 0 and 1 fuse into one 512-bit FMA; no second unit on port 5
    "cannonlake": 1,
    "icelake-client": 1,
    "tigerlake": 1,
    "rocketlake": 1,
    # Intel server cores with AVX-512: the fused port 0+1 unit and a second one on port 5 (most Xeon
    # Gold and Platinum; some Silver and Bronze parts lack port 5's, which LLVM's name cannot tell)
    "skylake-avx512": 2,
    "cascadelake": 2,
    "cooperlake": 2,
    "icelake-server": 2,
    "sapphirerapids": 2,
    "emeraldrapids": 2,
    "graniterapids": 2,
    # Intel AVX2 cores: two 256-bit FMA ports (0 and 1)
    "haswell": 2,
    "broadwell": 2,
    "skylake": 2,
    "alderlake": 2,  # its P-cores; its E-cores have two 128-bit pipes (one 256-bit FMA a cycle)
}

#: the names of :data:`FMA_UNITS` with one FMA per cycle at their full width
ONE_FMA_UNIT = frozenset(name for name, units in FMA_UNITS.items() if units == 1)

#: client cores with one 512-bit FMA unit that a cloud VM may report for a Xeon, which has two
_XEON_LOOKALIKES = frozenset({"cannonlake", "icelake-client", "tigerlake", "rocketlake"})


def fma_units_of(mcpu: str, features: Iterable[str] = ("fma",), model: str = "") -> int:
    """Vector FMAs per cycle of one core of LLVM cpu ``mcpu`` at its full vector width
    (:data:`FMA_UNITS`; two for a name not in it). A target without FMA counts one unit (a multiply
    and an add per cycle, two flops); a ``model`` naming a Xeon lifts the client names a cloud VM
    reports for it to two.

    >>> fma_units_of("znver4"), fma_units_of("znver5"), fma_units_of("rocketlake")
    (1, 2, 1)
    >>> fma_units_of("rocketlake", model="Intel(R) Xeon(R) Platinum 8481C"), fma_units_of("x86-64", ("sse2",))
    (2, 1)
    """
    features = frozenset(features)
    if "fma" not in features and not features & {"avx512f", "neon"}:
        return 1  # separate multiply and add: one of each per cycle, counted as one unit of two flops
    if mcpu in _XEON_LOOKALIKES and re.search(r"xeon", model, re.IGNORECASE):
        return 2
    return FMA_UNITS.get(mcpu, 2)


#: Bytes one core reads from the last-level cache per cycle. AMD's Zen cores (every EPYC and Ryzen; LLVM's
#: ``znver*``) read 32 bytes a cycle from their CCX's L3; 16 elsewhere, the figure the analytic model
#: assumed for every machine (an Intel Xeon's mesh L3 sustains about that per core).
ZEN_L3_BYTES_PER_CYCLE, L3_BYTES_PER_CYCLE = 32, 16


def l3_bytes_per_cycle_of(mcpu: str, model: str = "") -> int:
    """Bytes a core reads from L3 per cycle: :data:`ZEN_L3_BYTES_PER_CYCLE` on an AMD Zen core (named by the
    host's ``model``, or by ``mcpu`` where the model is unknown), else :data:`L3_BYTES_PER_CYCLE`. The
    model comes first because the cache is the host's whatever ``mcpu`` the code was compiled for.

    >>> l3_bytes_per_cycle_of("haswell", "AMD EPYC 7B13"), l3_bytes_per_cycle_of("znver3")
    (32, 32)
    >>> l3_bytes_per_cycle_of("znver3", "Intel(R) Xeon(R) Gold 6248"), l3_bytes_per_cycle_of("cascadelake")
    (16, 16)
    """
    if model:
        zen = re.search(r"\bAMD\b.*\b(EPYC|Ryzen|Threadripper)\b", model, re.IGNORECASE) is not None
    else:
        zen = mcpu.startswith("znver")
    return ZEN_L3_BYTES_PER_CYCLE if zen else L3_BYTES_PER_CYCLE


@dataclass(frozen=True)
class Machine:
    """The CPU a kernel is compiled for and runs on. Sizes in bytes, clock in GHz."""

    mcpu: str
    isa: str  # "avx512", "avx2", "avx", "sse" or "scalar"
    vector_bits: int
    vector_registers: int
    fma_units: int  # vector FMAs one core starts per cycle at vector_bits (fma_units_of)
    cores: int
    ghz: float
    l1d: int = 32 * 1024
    l2: int = 1024 * 1024
    l3: int = 16 * 1024 * 1024
    model: str = ""
    l3_bytes_per_cycle: int = L3_BYTES_PER_CYCLE  # per core (l3_bytes_per_cycle_of)
    features: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` in one vector register.

        >>> from_features("znver3", {"avx2", "fma"}, cores=1, ghz=1.0).lanes("float64")
        4
        """
        return max(1, self.vector_bits // dtype_bits(dtype))

    def accumulators(self) -> int:
        """Vector registers a register tile may fill with accumulators: half the register file. The
        other half holds the step's weight vectors, the broadcast values and, under unrolled windows,
        the loads LLVM hoists. Measured on one core of a Sapphire Rapids Xeon: conv2d 3x3 at
        128x28x28 with 28 of 32 zmm registers as accumulators ran 2.2x slower than with 14; matmul
        512x1024x1024 for AVX2 (``haswell``) with 16 of 16 ymm registers 9x slower than with 8.

        >>> from_features("haswell", {"avx2", "fma"}, cores=1, ghz=1.0).accumulators()
        8
        """
        return max(1, self.vector_registers // 2)

    def peak_gflops(self, dtype: str = "float32") -> float:
        """Peak GFLOP/s of all cores: cores x FMA units x lanes x 2 flops (a multiply and an add) x GHz."""
        # a machine without FMA counts one unit of a multiply and an add per cycle (from_features)
        return self.cores * self.fma_units * 2 * self.lanes(dtype) * self.ghz

    def describe(self) -> str:
        """One line for benchmark headers: model, mcpu, ISA, registers, cores, clock, caches, peak."""
        name = f"{self.model} " if self.model else ""
        units = f"{self.fma_units} FMA unit{'' if self.fma_units == 1 else 's'}"
        return (
            f"{name}(mcpu {self.mcpu}): {self.isa.upper()}, {self.lanes()} fp32 lanes x {self.vector_registers} "
            f"vector registers, {units}, {self.cores} cores at {self.ghz:.2f} GHz, "
            f"L1d {self.l1d // 1024} KiB, L2 {self.l2 // 1024} KiB; assumed peak {self.peak_gflops():.0f} GFLOP/s fp32"
        )


def from_features(
    mcpu: str,
    features: Iterable[str],
    *,
    cores: int,
    ghz: float,
    caches: dict[str, int] | None = None,
    model: str = "",
) -> Machine:
    """The machine of an ``mcpu`` with LLVM target ``features`` (no TVM needed: tests give the features).

    >>> m = from_features("x", {"sse2"}, cores=4, ghz=2.0)
    >>> m.isa, m.lanes(), m.vector_registers
    ('sse', 4, 16)
    """
    features = frozenset(features)
    if "avx512f" in features:
        isa, bits, registers = "avx512", 512, 32
    elif "avx2" in features:
        isa, bits, registers = "avx2", 256, 16
    elif "avx" in features:
        isa, bits, registers = "avx", 256, 16
    elif features & {"sse", "sse2", "sse4.1", "sse4.2"}:
        isa, bits, registers = "sse", 128, 16
    elif "neon" in features:
        isa, bits, registers = "neon", 128, 32
    else:
        isa, bits, registers = "scalar", 32, 16
    units = fma_units_of(mcpu, features, model)
    caches = caches or {}
    return Machine(
        mcpu=mcpu,
        isa=isa,
        vector_bits=bits,
        vector_registers=registers,
        fma_units=units,
        cores=max(1, int(cores)),
        ghz=float(ghz),
        l1d=caches.get("l1d", 32 * 1024),
        l2=caches.get("l2", 1024 * 1024),
        l3=caches.get("l3", 16 * 1024 * 1024),
        model=model,
        l3_bytes_per_cycle=l3_bytes_per_cycle_of(mcpu, model),
        features=features,
    )


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def _bytes(text: str) -> int | None:
    """``48K`` / ``2048K`` / ``480M`` (sysfs) as bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        return None
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[match.group(2).upper()]
    return int(match.group(1)) * scale


def host_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """The host's data caches per core (``l1d``, ``l2``) and the last level (``l3``), from sysfs;
    the keys it cannot read are left out."""
    found: dict[str, int] = {}
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        return found
    for entry in entries:
        level = _read(f"{root}/{entry}/level").strip()
        kind = _read(f"{root}/{entry}/type").strip()
        size = _bytes(_read(f"{root}/{entry}/size"))
        if size is None or kind == "Instruction":
            continue
        key = {"1": "l1d", "2": "l2", "3": "l3"}.get(level)
        if key is not None:
            found[key] = size
    return found


def host_model(cpuinfo: str | None = None) -> str:
    """The host CPU's model name (``/proc/cpuinfo``), or ``""``."""
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return re.sub(r"\s+", " ", match.group(1)).strip() if match else ""


def host_ghz(cpuinfo: str | None = None) -> float:
    """The host's clock in GHz: the highest maximum frequency in sysfs, else the highest ``cpu MHz`` of
    ``/proc/cpuinfo``, else 2.0 (a guess, said by :meth:`Machine.describe`)."""
    best = 0.0
    for cpu in range(os.cpu_count() or 1):
        khz = _read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq").strip()
        if khz.isdigit():
            best = max(best, int(khz) / 1e6)
    if best:
        return best
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    mhz = [float(v) for v in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", text, re.MULTILINE)]
    return max(mhz) / 1000 if mhz else 2.0
