"""The device-plugin API: committed generated code is fresh, and the wire format is the kubelet's.

Freshness: the ``proto`` recipe of the Justfile is run as written (only its output directories
point to a temporary one) and the three generated files must equal the committed ones byte for
byte, so editing api.proto without ``just proto`` fails here. Wire compatibility: the package,
service and method names, and every message and field number of docs/domain.md §7, read from the
descriptors the generated code registers; plus a few messages encoded by hand.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from reconciler.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
PROTO = Path("reconciler/deviceplugin/v1beta1/api.proto")
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def proto_recipe() -> list[str]:
    """The command line of the Justfile's ``proto`` recipe, ``{{python}}`` resolved."""
    lines = (REPO / "Justfile").read_text(encoding="utf-8").splitlines()
    start = lines.index("proto:")
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith((" ", "\t")):
            break
        body.append(line.strip())
    assert len(body) == 1, f"the proto recipe is expected to be one command: {body}"
    argv = shlex.split(body[0])
    assert argv[0] == "{{python}}", argv
    return [sys.executable, *argv[1:]]


def generate(out: Path, *, proto_root: Path = REPO) -> Path:
    """Run the recipe from ``proto_root`` with every ``--*_out=.`` redirected to ``out``.

    The include path and the proto's path stay as written: they are embedded in the output.
    """
    argv = proto_recipe()
    outs = [a for a in argv if re.fullmatch(r"--\w+_out=\.", a)]
    assert sorted(outs) == ["--grpc_python_out=.", "--pyi_out=.", "--python_out=."], argv
    argv = [f"{a[:-1]}{out}" if a in outs else a for a in argv]
    out.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        argv, cwd=proto_root, capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, f"{argv}\n{res.stdout}\n{res.stderr}"
    return out / PROTO.parent


def test_committed_code_is_what_just_proto_generates(tmp_path: Path) -> None:
    generated = generate(tmp_path)
    for name in GENERATED:
        committed = (REPO / PROTO.parent / name).read_bytes()
        fresh = (generated / name).read_bytes()
        assert fresh == committed, f"{PROTO.parent / name} is stale: run `just proto`"


def test_a_changed_proto_is_detected(tmp_path: Path) -> None:
    # The freshness check above must be able to fail: a proto with one more field generates
    # different code.
    root = tmp_path / "repo"
    (root / PROTO.parent).mkdir(parents=True)
    text = (REPO / PROTO).read_text(encoding="utf-8")
    assert "message Empty {}" in text
    (root / PROTO).write_text(text.replace("message Empty {}", "message Empty { int32 x = 1; }"))
    generated = generate(tmp_path / "out", proto_root=root)
    changed = [
        name
        for name in GENERATED
        if (generated / name).read_bytes() != (REPO / PROTO.parent / name).read_bytes()
    ]
    assert "api_pb2.py" in changed


def test_package_and_services() -> None:
    file = api_pb2.DESCRIPTOR
    assert file.package == "v1beta1"
    assert set(file.services_by_name) == {"Registration", "DevicePlugin"}
    methods = {
        (service.full_name, m.name): (
            m.input_type.full_name,
            m.output_type.full_name,
            m.client_streaming,
            m.server_streaming,
        )
        for service in file.services_by_name.values()
        for m in service.methods
    }
    assert methods == {
        ("v1beta1.Registration", "Register"): (
            "v1beta1.RegisterRequest",
            "v1beta1.Empty",
            False,
            False,
        ),
        ("v1beta1.DevicePlugin", "GetDevicePluginOptions"): (
            "v1beta1.Empty",
            "v1beta1.DevicePluginOptions",
            False,
            False,
        ),
        ("v1beta1.DevicePlugin", "ListAndWatch"): (
            "v1beta1.Empty",
            "v1beta1.ListAndWatchResponse",
            False,
            True,
        ),
        ("v1beta1.DevicePlugin", "GetPreferredAllocation"): (
            "v1beta1.PreferredAllocationRequest",
            "v1beta1.PreferredAllocationResponse",
            False,
            False,
        ),
        ("v1beta1.DevicePlugin", "Allocate"): (
            "v1beta1.AllocateRequest",
            "v1beta1.AllocateResponse",
            False,
            False,
        ),
        ("v1beta1.DevicePlugin", "PreStartContainer"): (
            "v1beta1.PreStartContainerRequest",
            "v1beta1.PreStartContainerResponse",
            False,
            False,
        ),
    }


class _RecordingChannel:
    """Stands in for a grpc.Channel: records the method paths the generated stubs use."""

    def __init__(self) -> None:
        self.paths: set[str] = set()

    def _record(self, path: str, *args: Any, **kwargs: Any) -> None:
        self.paths.add(path)

    unary_unary = unary_stream = stream_unary = stream_stream = _record


def test_stub_method_paths_are_the_kubelets() -> None:
    channel = _RecordingChannel()
    api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
    api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
    assert channel.paths == {
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    }


S, B, I32, I64 = "string", "bool", "int32", "int64"
MAP = "map<string,string>"


def rep(kind: str) -> str:
    return f"repeated {kind}"


# docs/domain.md §7 (the kubelet's k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto):
# message -> field name -> (number, type).
MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
    "Empty": {},
    "DevicePluginOptions": {
        "pre_start_required": (1, B),
        "get_preferred_allocation_available": (2, B),
    },
    "RegisterRequest": {
        "version": (1, S),
        "endpoint": (2, S),
        "resource_name": (3, S),
        "options": (4, "DevicePluginOptions"),
    },
    "ListAndWatchResponse": {"devices": (1, rep("Device"))},
    "TopologyInfo": {"nodes": (1, rep("NUMANode"))},
    "NUMANode": {"ID": (1, I64)},
    "Device": {"ID": (1, S), "health": (2, S), "topology": (3, "TopologyInfo")},
    "PreStartContainerRequest": {"devices_ids": (1, rep(S))},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {
        "container_requests": (1, rep("ContainerPreferredAllocationRequest"))
    },
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": (1, rep(S)),
        "must_include_deviceIDs": (2, rep(S)),
        "allocation_size": (3, I32),
    },
    "PreferredAllocationResponse": {
        "container_responses": (1, rep("ContainerPreferredAllocationResponse"))
    },
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, rep(S))},
    "AllocateRequest": {"container_requests": (1, rep("ContainerAllocateRequest"))},
    "ContainerAllocateRequest": {"devices_ids": (1, rep(S))},
    "AllocateResponse": {"container_responses": (1, rep("ContainerAllocateResponse"))},
    "ContainerAllocateResponse": {
        "envs": (1, MAP),
        "mounts": (2, rep("Mount")),
        "devices": (3, rep("DeviceSpec")),
        "annotations": (4, MAP),
        "cdi_devices": (5, rep("CDIDevice")),
    },
    "CDIDevice": {"name": (1, S)},
    "Mount": {"container_path": (1, S), "host_path": (2, S), "read_only": (3, B)},
    "DeviceSpec": {"container_path": (1, S), "host_path": (2, S), "permissions": (3, S)},
}

_SCALARS = {
    FieldDescriptor.TYPE_STRING: S,
    FieldDescriptor.TYPE_BOOL: B,
    FieldDescriptor.TYPE_INT32: I32,
    FieldDescriptor.TYPE_INT64: I64,
}


def _field_type(field: Any) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        entry = field.message_type
        if entry.GetOptions().map_entry:
            key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
            return f"map<{_SCALARS[key.type]},{_SCALARS[value.type]}>"
        name = entry.full_name.removeprefix("v1beta1.")
    else:
        name = _SCALARS.get(field.type, f"type {field.type}")
    return f"repeated {name}" if field.is_repeated else name


def test_every_message_and_field_number() -> None:
    messages = api_pb2.DESCRIPTOR.message_types_by_name
    assert set(messages) == set(MESSAGES)
    actual = {
        name: {f.name: (f.number, _field_type(f)) for f in message.fields}
        for name, message in messages.items()
    }
    for name, fields in MESSAGES.items():
        assert actual[name] == fields, name


@pytest.mark.parametrize(
    ("message", "wire"),
    [
        # Field 1 (version), wire type 2 (length-delimited): tag 0x0a.
        (api_pb2.RegisterRequest(version="v1beta1"), b"\x0a\x07v1beta1"),
        # options = field 4 (tag 0x22) holding get_preferred_allocation_available = field 2.
        (
            api_pb2.RegisterRequest(
                resource_name="r",
                options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
            ),
            b"\x1a\x01r\x22\x02\x10\x01",
        ),
        (
            api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID="u", health="Healthy")]),
            b"\x0a\x0c\x0a\x01u\x12\x07Healthy",
        ),
        # allocation_size = field 3, varint: tag 0x18.
        (
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        must_include_deviceIDs=["a"], allocation_size=2
                    )
                ]
            ),
            b"\x0a\x05\x12\x01a\x18\x02",
        ),
        # A map entry is a message {key = 1, value = 2}; DeviceSpec permissions = field 3.
        (
            api_pb2.ContainerAllocateResponse(
                envs={"K": "V"}, devices=[api_pb2.DeviceSpec(permissions="mrw")]
            ),
            b"\x0a\x06\x0a\x01K\x12\x01V\x1a\x05\x1a\x03mrw",
        ),
    ],
)
def test_wire_encoding(message: Any, wire: bytes) -> None:
    assert message.SerializeToString(deterministic=True) == wire
    assert type(message).FromString(wire) == message
