"""raytrain.nvml: the no-GPU path for real, and the parsing of NVML answers with a fake library (the only
thing faked: NVML itself cannot exist on a machine without an NVIDIA driver)."""
import sys
from types import SimpleNamespace

import pynvml
import pytest

from raytrain import nvml
from raytrain.nvml import bandwidth_gb_s, gpu_count, gpu_inventory
from tests.conftest import needs


def _has_nvml() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_no_gpu_for_real():
    """Here nvmlInit raises NVMLError_LibraryNotFound: the inventory is empty, not an error."""
    if _has_nvml():
        pytest.skip(needs("no NVIDIA driver", "this machine has an NVIDIA driver"))
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    assert gpu_inventory() == []
    assert gpu_count() == 0


def test_no_library_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert gpu_inventory() == []


def not_supported():
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


class FakeNVML:
    """pynvml's names with an H100's answers; ``unsupported`` names raise NVMLError_NotSupported."""

    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, count=2, unsupported=(), init_error=None):
        self.count, self.unsupported, self.init_error = count, set(unsupported), init_error
        self.calls = []
        self.shutdowns = 0

    def __getattribute__(self, name):
        if name.startswith("nvml") and name in object.__getattribute__(self, "unsupported"):
            def refuse(*args):
                raise not_supported()
            return refuse
        return object.__getattribute__(self, name)

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlSystemGetDriverVersion(self):
        return b"570.86.15"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 12080

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"  # older nvidia-ml-py answers bytes

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000-{h[1]}"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=85_520_809_984, free=84_000_000_000, used=1_520_809_984)

    def nvmlDeviceGetMemoryBusWidth(self, h):
        return 5120

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        assert clock == pynvml.NVML_CLOCK_MEM
        return 2619

    def nvmlDeviceGetNumGpuCores(self, h):
        return 16896

    def nvmlDeviceGetAttributes(self, h):
        return SimpleNamespace(multiprocessorCount=132)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=87, memory=41)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 54

    def nvmlDeviceGetPowerUsage(self, h):
        return 412_345  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000


def test_parses_every_field():
    fake = FakeNVML(count=2)
    gpus = gpu_inventory(fake)
    assert [g["index"] for g in gpus] == [0, 1]
    g = gpus[1]
    assert g["name"] == "NVIDIA H100 80GB HBM3" and g["uuid"] == "GPU-0000-1"
    assert (g["memory_total"], g["memory_free"], g["memory_used"]) == (85_520_809_984, 84_000_000_000, 1_520_809_984)
    assert g["memory_bus_width_bits"] == 5120 and g["max_memory_clock_mhz"] == 2619
    assert g["bandwidth_gb_s"] == pytest.approx(3352.3, abs=0.1)  # NVIDIA's H100 SXM figure: 3.35 TB/s
    assert g["sm_count"] == 132 and g["cuda_cores"] == 16896 and g["compute_capability"] == "9.0"
    assert (g["utilization_gpu"], g["utilization_memory"]) == (87, 41)
    assert g["temperature_c"] == 54
    assert g["power_w"] == pytest.approx(412.345) and g["power_limit_w"] == 700.0
    assert g["driver_version"] == "570.86.15" and g["cuda_version"] == "12.8"
    assert fake.shutdowns == 1


def test_one_unsupported_field_is_none_and_the_rest_stand():
    fake = FakeNVML(count=1, unsupported={"nvmlDeviceGetMemoryBusWidth", "nvmlDeviceGetPowerUsage",
                                          "nvmlDeviceGetAttributes", "nvmlSystemGetCudaDriverVersion_v2"})
    fake.nvmlSystemGetCudaDriverVersion = lambda: 12040  # the older call still answers
    (g,) = gpu_inventory(fake)
    assert g["memory_bus_width_bits"] is None and g["bandwidth_gb_s"] is None
    assert g["power_w"] is None
    assert g["max_memory_clock_mhz"] == 2619 and g["memory_total"] == 85_520_809_984
    assert g["sm_count"] == 132  # derived: 16896 cores / 128 per SM on compute capability 9.0
    assert g["cuda_version"] == "12.4"


def test_functions_missing_from_an_old_nvidia_ml_py_are_none():
    fake = FakeNVML(count=1)
    lean = SimpleNamespace(**{name: getattr(fake, name) for name in (
        "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName",
        "nvmlDeviceGetMemoryInfo")})
    (g,) = gpu_inventory(lean)
    assert g["name"] == "NVIDIA H100 80GB HBM3" and g["memory_free"] == 84_000_000_000
    assert g["sm_count"] is None and g["temperature_c"] is None and g["driver_version"] is None


def test_init_failure_or_no_device_is_an_empty_inventory():
    lib_missing = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert isinstance(lib_missing, pynvml.NVMLError_LibraryNotFound)
    assert gpu_inventory(FakeNVML(init_error=lib_missing)) == []
    assert gpu_inventory(FakeNVML(count=0)) == []
    gone = FakeNVML(count=2, unsupported={"nvmlDeviceGetHandleByIndex"})
    assert gpu_inventory(gone) == [] and gone.shutdowns == 1


def test_bandwidth_matches_vendor_figures():
    assert bandwidth_gb_s(5120, 1215) == pytest.approx(1555, abs=1)  # A100 40GB
    assert bandwidth_gb_s(384, 10501) == pytest.approx(1008, abs=1)  # RTX 4090 (GDDR6X)
    assert bandwidth_gb_s(None, 1215) is None


def test_nvml_call_isolates_errors():
    def boom():
        raise not_supported()

    assert nvml.nvml_call(boom) is None
    assert nvml.nvml_call(None) is None
    assert nvml.nvml_call(lambda x: x + 1, 1) == 2


def test_only_nvml_errors_become_none():
    """NVML's own errors (any NVMLError subclass) are "no answer"; a misspelt name or a wrong signature is a
    bug and raises instead of becoming a silent None that a fake library would also pass."""
    def lost(*_):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    assert nvml.nvml_call(lost) is None
    assert nvml.nvml_call(None) is None  # a function this nvidia-ml-py lacks (getattr default)

    def typo(*_):
        return pynvml.nvmlDeviceGetMemoryInfoo  # AttributeError

    with pytest.raises(AttributeError):
        nvml.nvml_call(typo)
    with pytest.raises(TypeError):
        nvml.nvml_call(lambda handle: handle)  # called without its handle


def test_a_fake_init_error_that_is_not_nvmls_raises():
    with pytest.raises(RuntimeError):
        gpu_inventory(FakeNVML(init_error=RuntimeError("a bug, not a missing driver")))
