"""Property strings in both trailing-separator styles (spec §3.1-3.4)."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqstore.errors import InputError
from rmqstore.properties import decode_properties, encode_properties, java_text, split_keys

from support import vectors

EXPECTED = {
    "TAGS": "TagA",
    "KEYS": "order-1 order-2",
    "UNIQ_KEY": "C0A8000A0FA0759A6E0E1B2E00000001",
}


def test_both_styles_decode_to_the_same_properties() -> None:
    encoding = vectors()["propertiesEncoding"]
    five = bytes.fromhex(encoding["properties_5x_style_hex"])
    four_nine = bytes.fromhex(encoding["properties_4_9_style_hex"])
    assert five.endswith(b"\x02") and not four_nine.endswith(b"\x02")
    assert decode_properties(five) == EXPECTED
    assert decode_properties(four_nine) == EXPECTED


def test_encoding_matches_both_styles_byte_for_byte() -> None:
    encoding = vectors()["propertiesEncoding"]
    assert encode_properties(EXPECTED) == bytes.fromhex(encoding["properties_5x_style_hex"])
    assert encode_properties(EXPECTED, trailing_separator=False) == bytes.fromhex(
        encoding["properties_4_9_style_hex"]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("C\x01z\x01w\x02", {"C": "z\x01w"}),  # the value may hold 0x01 (4.9+ parser)
        ("\x01y\x02", {}),  # empty name dropped
        ("a\x01\x02b\x01c", {"b": "c"}),  # empty value dropped
        ("a\x011\x02a\x012", {"a": "2"}),  # later duplicates win
        ("", {}),
        ("noseparator", {}),
    ],
)
def test_parser_edge_cases_follow_4_9_rules(text: str, expected: dict) -> None:
    assert decode_properties(text) == expected


@pytest.mark.parametrize("bad", [{"": "v"}, {"k": ""}, {"k\x01": "v"}, {"k": "v\x02"}])
def test_encoder_refuses_what_a_broker_would_misparse(bad: dict) -> None:
    with pytest.raises(InputError):
        encode_properties(bad)


def test_encoder_refuses_more_than_32767_bytes() -> None:
    with pytest.raises(InputError, match="32767"):
        encode_properties({"big": "x" * 40000})


def test_keys_split_like_java_with_empty_pieces_skipped() -> None:
    assert split_keys("k1  k2 ") == ["k1", "k2"]
    assert split_keys(None) == []
    assert split_keys("one") == ["one"]


names = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
)


@given(st.dictionaries(names, names, max_size=8), st.booleans())
def test_round_trip(properties: dict, trailing: bool) -> None:
    encoded = encode_properties(properties, trailing_separator=trailing)
    assert decode_properties(encoded) == properties


# malformed UTF-8 and the UTF-16 code units Java 17's new String(bytes, UTF_8) made of it
# (printed by the JVM this project's Spark runs on); 0xED 0xA0..0xBF, half of a surrogate
# pair as CESU-8 writes one, is where Python's errors="replace" writes more U+FFFD than Java
JAVA_DECODED = {
    "eda080": "fffd",
    "edbfbf": "fffd",
    "edbf": "fffd",
    "eda0ff": "fffdfffd",
    "5bedb6db80": "005bfffd06c0",
    "eda0bdedb880": "fffdfffd",  # U+1F600 in CESU-8
    "ff": "fffd",
    "c0af": "fffdfffd",
    "e282": "fffd",
    "f09f98": "fffd",
    "f4908080": "fffdfffdfffdfffd",
    "e0808f": "fffdfffdfffd",
    "6b2d41": "006b002d0041",
    "ed9fbf": "d7ff",
}


@pytest.mark.parametrize(("data", "units"), sorted(JAVA_DECODED.items()))
def test_malformed_utf8_decodes_as_java_decodes_it(data: str, units: str) -> None:
    text = java_text(bytes.fromhex(data))
    assert text.encode("utf-16-be", "surrogatepass").hex() == units
    assert decode_properties(b"TAGS\x01" + bytes.fromhex(data)) == {"TAGS": text}


def test_malformed_utf8_decodes_as_the_jvm_here_decodes_it(tmp_path: Path) -> None:
    """Random bytes, mostly the ones UTF-8 decoders disagree on, through the JVM's own
    decoder and :func:`java_text`: the same UTF-16 code units, every one."""
    javac = shutil.which("javac")
    if javac is None:
        pytest.skip("no javac (a JDK) on PATH")  # JAVA_DECODED still holds the rules
    source = tmp_path / "Decode.java"
    source.write_text(
        "import java.io.*; import java.nio.charset.StandardCharsets;\n"
        "public class Decode { public static void main(String[] a) throws Exception {\n"
        " BufferedReader in = new BufferedReader(new InputStreamReader(System.in));\n"
        " StringBuilder out = new StringBuilder(); String line;\n"
        " while ((line = in.readLine()) != null) {\n"
        "  byte[] b = new byte[line.length() / 2];\n"
        "  for (int i = 0; i < b.length; i++)\n"
        "   b[i] = (byte) Integer.parseInt(line.substring(2 * i, 2 * i + 2), 16);\n"
        "  String s = new String(b, StandardCharsets.UTF_8);\n"
        "  for (int i = 0; i < s.length(); i++)\n"
        '   out.append(String.format("%04x", (int) s.charAt(i)));\n'
        "  out.append('\\n'); }\n"
        " System.out.print(out); } }\n"
    )
    subprocess.run([javac, "-d", str(tmp_path), str(source)], check=True)
    rng = random.Random(20261201)
    awkward = [0x41, 0x80, 0xBF, 0xC0, 0xC2, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF, 0x9F, 0xA0]
    cases = [
        bytes(
            rng.choice(awkward) if rng.random() < 0.85 else rng.randrange(256)
            for _ in range(rng.randint(1, 12))
        )
        for _ in range(20_000)
    ]
    done = subprocess.run(
        ["java", "-cp", str(tmp_path), "Decode"],
        input="".join(case.hex() + "\n" for case in cases),
        capture_output=True,
        text=True,
        check=True,
    )
    decoded = done.stdout.split("\n")[: len(cases)]
    for case, units in zip(cases, decoded, strict=True):
        assert java_text(case).encode("utf-16-be", "surrogatepass").hex() == units, case.hex()
