"""Text from a host is shown on the user's terminal only after escape sequences are taken out."""
from __future__ import annotations

import pytest

from draftops.terminal import clean

ESC = "\x1b"


@pytest.mark.parametrize("raw, shown", [
    ("plain text\twith a tab", "plain text\twith a tab"),
    (f"{ESC}[31mred{ESC}[0m", "red"),                                  # SGR colour
    (f"{ESC}[2J{ESC}[H{ESC}[1;1Hhome", "home"),                       # clear screen, move cursor
    (f"{ESC}]0;pwned title\x07after", "after"),                       # OSC window title, BEL end
    (f"{ESC}]52;c;cm0gLXJmIH4=\x1b\\after", "after"),                  # OSC 52 clipboard, ST end
    (f"{ESC}]8;;http://evil.example\x07link{ESC}]8;;\x07", "link"),    # OSC 8 hyperlink
    (f"{ESC}P1$r{ESC}\\dcs", "dcs"),                                  # DCS string
    (f"{ESC}7{ESC}8saved", "saved"),                                  # two-byte escapes
    ("\x9b2Jc1 csi", "c1 csi"),                                       # 8-bit CSI
    ("\x9d0;title\x07t", "t"),                                        # 8-bit OSC
    ("bell\x07 back\x08space nul\x00 del\x7f", "bell backspace nul del"),
    ("abc\u202edcba", "abcdcba"),                                     # bidi override
    ("10%\r50%\r100%", "100%"),                                       # progress redraw: what a terminal shows
    ("line\r\n", "line\n"),
    (f"unterminated {ESC}]0;title", "unterminated "),
    (f"an unterminated string ends with its line {ESC}]0;title\nnext",
     "an unterminated string ends with its line \nnext"),
    (f"lone escape at the end {ESC}", "lone escape at the end "),
    (f"{ESC}[", ""),
    ("multi\nline\n\tindented", "multi\nline\n\tindented"),
    ("unicode ✓ ünïcödé 漢字", "unicode ✓ ünïcödé 漢字"),
])
def test_clean_keeps_text_and_drops_control_sequences(raw, shown):
    assert clean(raw) == shown


def test_clean_output_has_no_control_characters_left_for_any_byte():
    everything = "".join(chr(i) for i in range(0xa0)) + "".join(chr(i) for i in range(0x2060, 0x2070))
    out = clean(everything + "\nend")
    assert out.endswith("end")
    assert all(ch in "\t\n" or not (ord(ch) < 0x20 or 0x7f <= ord(ch) < 0xa0) for ch in out)
    assert not any(0x2066 <= ord(ch) <= 0x2069 for ch in out)
