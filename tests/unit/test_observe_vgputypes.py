"""``nvidia-smi vgpu -s -v -i <GPU>`` read into type id → name (``observe/vgputypes.py``).

The well-formed sample is cut from the public capture the module cites (bigstack-oss/cubecos,
``core/sdk_sh/tests/test_gpu_sriov_vgpu_count_limit.sh``, an RTX PRO 6000 Blackwell on driver
580.105.06): ids in hex, keys padded to column 42. Everything else that is not that shape makes
the whole answer unusable, with the reason: nothing half-read names a vGPU.
"""

from __future__ import annotations

import pytest

from reconciler.model import PciAddress
from reconciler.observe.vgputypes import (
    MAX_OUTPUT,
    SupportedTypes,
    check_against_lists,
    parse_supported_types,
    smi_bus_id,
    supported_types_argv,
)

GPU = PciAddress.parse("0000:8c:00.0")
CAPTURE = """GPU 00000000:8C:00.0
    vGPU Type ID                          : 0x5ee
        Name                              : NVIDIA RTX Pro 6000 Blackwell DC-2B
        Class                             : NVS
        GPU Instance Profile ID           : N/A
        Max Instances                     : 32
        Max Instances Per VM              : 1
        Max Instances Per GI              : N/A
        FB Memory                         : 2048 MiB
    vGPU Type ID                          : 0x5f1
        Name                              : NVIDIA RTX Pro 6000 Blackwell DC-4Q
        Class                             : Quadro
        GPU Instance Profile ID           : N/A
        Max Instances                     : 24
        FB Memory                         : 4096 MiB
    vGPU Type ID                          : 0x60a
        Name                              : NVIDIA RTX Pro 6000 Blackwell DC-1-2Q
        GPU Instance Profile ID           : 19
"""


def test_the_capture_is_read_with_its_hex_ids_as_sysfs_prints_them() -> None:
    answer = parse_supported_types(CAPTURE, GPU)
    assert answer.problem is None
    assert dict(answer.names) == {
        "1518": "NVIDIA RTX Pro 6000 Blackwell DC-2B",
        "1521": "NVIDIA RTX Pro 6000 Blackwell DC-4Q",
        "1546": "NVIDIA RTX Pro 6000 Blackwell DC-1-2Q",
    }


def test_the_gpu_is_asked_by_nvidia_smis_own_bus_id() -> None:
    assert smi_bus_id(PciAddress.parse("0000:af:00.0")) == "00000000:AF:00.0"
    assert supported_types_argv(GPU) == ["vgpu", "-s", "-v", "-i", "00000000:8C:00.0"]


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("", "no section for GPU 0000:8c:00.0"),
        ("No devices were found\n", "'No devices were found' is not the section of GPU"),
        (CAPTURE.replace("8C:00.0", "8D:00.0"), "is not the section of GPU 0000:8c:00.0"),
        (CAPTURE + "GPU 00000000:8C:00.0\n", "a second section"),
        (CAPTURE.replace(": 0x5ee", ": 1518"), "a vGPU Type ID '1518' that is not 0x-hex"),
        (CAPTURE.replace(": 0x5ee", ": 0xzz"), "that is not 0x-hexadecimal"),
        (
            CAPTURE.replace(
                "        Name                              : NVIDIA RTX Pro 6000 Blackwell DC-4Q\n",
                "",
            ),
            "type id 0x5f1 has no Name",
        ),
        (CAPTURE + "    vGPU Type ID : 0x700\n", "type id 0x700 has no Name"),
        (CAPTURE.replace("GPU 00000000:8C:00.0\n", ""), "before any GPU section"),
        (CAPTURE + "        Name : NVIDIA X-1Q\n", "a Name 'NVIDIA X-1Q' outside a vGPU type"),
        (CAPTURE + "    garbage without a colon\n", "cannot read the line"),
        (
            CAPTURE + "    vGPU Type ID : 0x5ee\n        Name : NVIDIA Other-1Q\n",
            "type id 0x5ee is named twice",
        ),
        (CAPTURE.replace("DC-2B", 'DC-2B"'), "Name"),
        ("GPU 00000000:8C:00.0\n" + " " * MAX_OUTPUT, "characters of output: not read"),
    ],
)
def test_anything_unexpected_makes_the_whole_answer_unusable(output: str, reason: str) -> None:
    answer = parse_supported_types(output, GPU)
    assert answer.names == {}
    assert answer.problem is not None
    assert answer.problem.startswith("nvidia-smi vgpu -s -v -i 00000000:8C:00.0: ")
    assert reason in answer.problem


def test_an_answer_is_used_only_when_it_agrees_with_every_list() -> None:
    answer = parse_supported_types(CAPTURE, GPU)
    agrees = {"1521": "NVIDIA RTX Pro 6000 Blackwell DC-4Q"}
    assert check_against_lists(answer, agrees) is answer
    assert check_against_lists(answer, {}) is answer  # at the maximum nothing is listed
    # A list naming an id otherwise (another id space, another GPU's answer) or one the answer
    # lacks: nothing from it is believed.
    other = check_against_lists(answer, {"1521": "NVIDIA RTX Pro 6000 Blackwell DC-8Q"})
    assert other.names == {}
    assert other.problem is not None and "but nvidia-smi names it" in other.problem
    missing = check_against_lists(answer, {"1600": "NVIDIA RTX Pro 6000 Blackwell DC-8Q"})
    assert missing.problem is not None and "does not list it" in missing.problem
    failed = SupportedTypes(problem="exit 9")
    assert check_against_lists(failed, agrees) is failed
