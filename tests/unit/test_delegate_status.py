"""``status --delegate harvester``'s document and text (``cli/delegate_status.py``) from a node
as Harvester's objects show it: every value from the cluster escaped in the text, each pending
VF's cause, and the document valid against schemas/delegate-status.schema.json."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from reconciler.cli.delegate_status import node_text, status_document
from reconciler.model import PciAddress
from reconciler.model.harvester import HarvesterGpu, HarvesterNode, HarvesterVf

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "delegate-status.schema.json").read_text()
)
GPU = PciAddress.parse("0000:08:00.0")
OTHER = PciAddress.parse("0000:09:00.0")


def _vf(function: int, parent: PciAddress = GPU, **fields: object) -> HarvesterVf:
    address = PciAddress(parent.domain, parent.bus, 0, function)
    return HarvesterVf(
        name=f"n1-0000{parent.bus:02x}00{function}",
        resource_version="1",
        address=address,
        parent=parent,
        **fields,  # type: ignore[arg-type]
    )


def test_text_escapes_what_the_objects_say_and_names_each_pending_cause() -> None:
    node = HarvesterNode(
        "n1",
        gpus=(HarvesterGpu("n1-000008000", "1", GPU, True),),
        vfs=(
            # A disable the controller has not carried out: its status still shows the vGPU.
            _vf(
                4,
                enabled=False,
                type_name="NVIDIA A2-4Q",
                configured=True,
                configured_type="NVIDIA A2-4Q",
                uuid="746",
            ),
            # A type name carrying a terminal escape (a hand-edited spec).
            _vf(5, enabled=True, type_name="NVIDIA\x1b[2J A2-4Q"),
            # A VF whose GPU has no SRIOVGPUDevice (left out, or not made yet).
            _vf(4, OTHER, enabled=False),
        ),
        used_by={"n1-000008004": "VM default/\x1b]0;x\x07win11"},
    )
    doc = status_document([node])
    jsonschema.validate(doc, SCHEMA)
    text = node_text(doc["nodes"][0])
    assert "\x1b" not in text and "\x07" not in text
    assert "NVIDIA\\x1b[2J A2-4Q" in text
    assert (
        "  PENDING n1-000008004: the disable is not carried out: the status still shows "
        "NVIDIA A2-4Q configured"
    ) in text.splitlines()
    assert "  PENDING n1-000008005: the enable of NVIDIA\\x1b[2J A2-4Q is not carried out" in text
    assert "GPU 0000:09:00.0: no SRIOVGPUDevice object" in text
    gpus = doc["nodes"][0]["gpus"]
    assert [(g["name"], g["address"], len(g["vfs"])) for g in gpus] == [
        ("n1-000008000", "0000:08:00.0", 2),
        (None, "0000:09:00.0", 1),
    ]
    assert doc["nodes"][0]["summary"] == {
        "gpus": 1, "vfs": 3, "hosting": 0, "pending": 2, "inUse": 1
    }  # fmt: skip
