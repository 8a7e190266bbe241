"""The command names and error codes agree between the C header and the Python module."""

import re

from lmcache_valkey.errors import FabricUnavailable, ServerError
from lmcache_valkey.transport.fabric import commands
from lmcache_valkey.transport.fabric.errors import NoFabricSession, ServerDeadline, TransferFailed, WindowTooSmall

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEADER = (ROOT / "endpoint" / "include" / "lmcv_commands.h").read_text()
REPLIES = (ROOT / "endpoint" / "include" / "lmcv_replies.h").read_text()


def _defines(text: str) -> dict[str, str]:
    return dict(re.findall(r'#define\s+(\w+)\s+"([^"]*)"', text))


def test_command_names_agree():
    d = _defines(HEADER)
    assert d["LMCV_CMD_HELLO"] == commands.HELLO
    assert d["LMCV_CMD_SET"] == commands.SET
    assert d["LMCV_CMD_GET"] == commands.GET
    assert d["LMCV_CMD_INFO"] == commands.INFO
    assert d["LMCV_OPT_PX"] == commands.OPT_PX
    assert d["LMCV_OPT_TIMEOUT"] == commands.OPT_TIMEOUT
    assert d["LMCV_OPT_PARTIAL"] == commands.OPT_PARTIAL
    assert d["LMCV_ACL_CATEGORY"] == commands.ACL_CATEGORY


def test_every_reply_has_an_upper_case_code_we_map():
    expected = {
        "NOHELLO": NoFabricSession, "BADWINDOW": WindowTooSmall, "XFERFAILED": TransferFailed,
        "TIMEOUT": ServerDeadline, "NOFABRIC": FabricUnavailable,
    }
    for name, text in _defines(REPLIES).items():
        code = text.split(" ", 1)[0]
        assert re.fullmatch(r"[A-Z]+", code), name
        err = commands.map_error(text.replace("%llu", "7").replace("%s", "x"))
        assert isinstance(err, expected.get(code, ServerError)), name


def test_timeout_reply_carries_inflight():
    err = commands.map_error("TIMEOUT transfer passed its deadline (100 ms); inflight=3")
    assert isinstance(err, ServerDeadline) and err.inflight == 3
