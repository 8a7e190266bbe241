"""The command names and error replies agree between the C headers and the Python module,
and every refusal the module can send maps to the exception the client acts on."""

import re
from pathlib import Path

from lmcache_valkey.errors import FabricUnavailable, OutOfMemory, ServerError
from lmcache_valkey.transport.fabric import commands
from lmcache_valkey.transport.fabric.errors import (
    ChecksumRefused,
    NoFabricSession,
    OutsideRegions,
    PeerNotProven,
    ServerDeadline,
    TransferFailed,
    WindowTooSmall,
)

ROOT = Path(__file__).resolve().parents[2]

HEADER = (ROOT / "endpoint" / "include" / "lmcv_commands.h").read_text()
REPLIES = (ROOT / "endpoint" / "include" / "lmcv_replies.h").read_text()


def _defines(text: str) -> dict[str, str]:
    return dict(re.findall(r'#define\s+(\w+)\s+"([^"]*)"', text))


def _errors() -> dict[str, tuple[str, str]]:
    """id -> (upstream text, deprecated-names text), from the X-macro table."""
    joined = re.sub(r'"\s+"', "", REPLIES.replace("\\\n", " "))  # continuations; adjacent literals
    rows = re.findall(r'X\((\w+),\s*[ns],\s*"((?:[^"\\]|\\.)*)",\s*"((?:[^"\\]|\\.)*)"\)', joined)
    return {name: (up, old) for name, up, old in rows}


def test_command_names_agree():
    d = _defines(HEADER)
    assert d["LMCV_CMD_RDMA_HELLO"] == commands.HELLO
    assert d["LMCV_CMD_RDMA_SET"] == commands.RDMA_SET
    assert d["LMCV_CMD_RDMA_GET"] == commands.RDMA_GET
    assert d["LMCV_CMD_TCP_SET"] == commands.TCP_SET
    assert d["LMCV_CMD_TCP_GET"] == commands.TCP_GET
    assert d["LMCV_CMD_INFO"] == commands.INFO
    assert d["LMCV_CMD_PROVE"] == commands.PROVE
    assert (d["LMCV_CMD_LEGACY_HELLO"], d["LMCV_CMD_LEGACY_SET"], d["LMCV_CMD_LEGACY_GET"]) == commands.LEGACY
    for opt in ("CRC", "PX", "TIMEOUT", "PARTIAL", "PROOF", "REGION"):
        assert d[f"LMCV_OPT_{opt}"] == getattr(commands, f"OPT_{opt}")
    assert (d["LMCV_INFO_LEN"], d["LMCV_INFO_CRC"], d["LMCV_INFO_TIER"]) == commands.INFO_FIELDS
    assert d["LMCV_ACL_CATEGORY"] == commands.ACL_CATEGORY
    assert d["LMCV_MODULE_NAME"] == commands.INFO_SECTION
    assert (d["LMCV_PEER_MODE_PROVEN"], d["LMCV_PEER_MODE_UNPROVEN"]) == (commands.PEER_MODE_PROVEN,
                                                                         commands.PEER_MODE_UNPROVEN)


EXPECTED = {
    "NOHELLO": NoFabricSession, "NOFABRIC": FabricUnavailable, "WINDOW": WindowTooSmall,
    "XFER_WRITE": TransferFailed, "XFER_READ": TransferFailed, "TIMEOUT": ServerDeadline,
    "NOSPACE": (OutOfMemory, ServerError), "PROOF_REQUIRED": PeerNotProven, "NOT_PROVEN": PeerNotProven,
    "PROOF_WRONG": PeerNotProven, "OUTSIDE_REGIONS": OutsideRegions, "CRC": ChecksumRefused,
    "DMA_CRC": ChecksumRefused, "DMA_CAPACITY": WindowTooSmall, "DMA_ADDR": PeerNotProven,
}


def test_every_reply_of_both_dialects_maps_to_the_exception_the_client_acts_on():
    errors = _errors()
    assert len(errors) > 30 and "NOHELLO" in errors
    for name, (upstream, legacy) in errors.items():
        for text in (upstream, legacy):
            assert re.fullmatch(r"[A-Z]+", text.split(" ", 1)[0]), (name, text)
            assert len(text) <= 200, name
            err = commands.map_error(text.replace("%llu", "7").replace("%s", "x"))
            want = EXPECTED.get(name, ServerError)
            assert isinstance(err, want), (name, text, type(err))


def test_timeout_reply_carries_inflight():
    err = commands.map_error("TIMEOUT transfer passed its deadline (100 ms); inflight=3")
    assert isinstance(err, ServerDeadline) and err.inflight == 3


def test_info_replies_parse_in_any_case():
    assert commands.parse_info_reply([b"len", 5, b"crc", 7, b"tier", b"dram"]) == (5, 7)
    assert commands.parse_info_reply(["LEN", 5, "CRC", 7]) == (5, 7)
    assert commands.parse_info_reply(None) is None
