"""broker.conf parsing and geometry resolution."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rmqstore.config import (
    StoreConfig,
    load_broker_config,
    parse_java_properties,
    round_consumequeue_size,
)
from rmqstore.delay import DelayLevels
from rmqstore.errors import InputError
from rmqstore.store import Store


def test_java_properties_syntax() -> None:
    text = (
        "# comment\n! also a comment\n  key1 = value one  \nkey2:value2\nkey3 value3\n"
        "multi = first \\\n    second\nescaped\\ key = tab\\there\nunicode=\\u00e9t\\u00e9\n"
        "empty=\n"
    )
    assert parse_java_properties(text) == {
        "key1": "value one  ",
        "key2": "value2",
        "key3": "value3",
        "multi": "first second",
        "escaped key": "tab\there",
        "unicode": "été",
        "empty": "",
    }


def test_broker_config_keys(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerClusterName=ProdCluster\nbrokerIP1=10.1.2.3\nlistenPort=10921\n"
        "storePathRootDir=/data/rocketmq/store\n"
        "storePathCommitLog=/data/rocketmq/store/commitlog\n"
        "mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=1990\n"
        "maxHashSlotNum=1000\nmaxIndexNum=2000\nflushDiskType=SYNC_FLUSH\n"
        "checkCRCOnRecover=false\nforceVerifyPropCRC=true\nenabledAppendPropCRC=TRUE\n"
        "maxMessageSize=1024\nmessageDelayLevel=1s 2s\n"
    )
    config = load_broker_config(conf, tmp_path / "copy")
    assert config.commitlog_file_size == 65536
    assert config.consumequeue_file_size == 2000  # rounded up to a multiple of 20
    assert (config.index_slots, config.index_entries) == (1000, 2000)
    assert config.flush_disk_type == "SYNC_FLUSH"
    assert config.check_crc_on_recover is False and config.force_verify_prop_crc is True
    assert config.append_prop_crc is True and config.max_message_size == 1024
    assert config.cluster_name == "ProdCluster"
    assert config.store_host == "10.1.2.3:10921"
    assert config.commitlog_dir == tmp_path / "copy" / "commitlog"  # re-rooted
    assert config.message_delay_level == "1s 2s"
    assert "broker config" in config.sources["commitlog_file_size"]


def test_4_3_spellings_and_outside_commitlog(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("mapedFileSizeCommitLog=4096\nstorePathCommitLog=/elsewhere/cl\n")
    config = load_broker_config(conf, tmp_path)
    assert config.commitlog_file_size == 4096
    assert config.commitlog_dir == Path("/elsewhere/cl")


@pytest.mark.parametrize(
    "line", ["mappedFileSizeCommitLog=big", "flushDiskType=SOMETIMES", "storePathCommitLog=/a,/b"]
)
def test_bad_values_are_input_errors(tmp_path: Path, line: str) -> None:
    """Each names the file: STORE/config/broker.properties is read without being asked for."""
    conf = tmp_path / "config" / "broker.properties"
    conf.parent.mkdir()
    conf.write_text(line + "\n")
    with pytest.raises(InputError, match=f"^broker config {re.escape(str(conf))}: "):
        load_broker_config(conf)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("mappedFileSizeCommitLog=0", "mappedFileSizeCommitLog=0 is outside 4,096..2,147,483,647"),
        ("mappedFileSizeCommitLog=-4096", "mappedFileSizeCommitLog=-4096 is outside"),
        (
            "mappedFileSizeCommitLog=4294967296",
            "mappedFileSizeCommitLog='4294967296' is not an integer to a broker",
        ),
        ("mappedFileSizeConsumeQueue=0", "mappedFileSizeConsumeQueue=0 is outside 20.."),
        ("maxHashSlotNum=0", "maxHashSlotNum=0 is outside 1.."),
        ("maxIndexNum=1", "maxIndexNum=1 is outside 2.."),
        ("maxMessageSize=-5", "maxMessageSize=-5 is outside 1.."),
        ("flushIntervalCommitLog=-1", "flushIntervalCommitLog=-1 is outside 0.."),
        ("maxIndexNum=200000000", "make index files of 4,020,000,040 bytes; a broker maps at"),
    ],
)
def test_values_no_broker_takes_are_refused(tmp_path: Path, line: str, said: str) -> None:
    """Sizes and counts a broker keeps in Java ints, and index files it could not map: a
    zero file size used to fail as an internal error, a huge one after creating files."""
    conf = tmp_path / "broker.conf"
    conf.write_text(line + "\n")
    with pytest.raises(InputError, match=re.escape(said)):
        load_broker_config(conf)


def test_the_largest_values_a_broker_takes_are_read(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "mappedFileSizeCommitLog=2147483647\nmappedFileSizeConsumeQueue=2147483640\n"
        "maxHashSlotNum=1\nmaxIndexNum=107374180\n"
    )
    config = load_broker_config(conf)
    assert (config.commitlog_file_size, config.consumequeue_file_size) == (2**31 - 1, 2147483640)
    assert 40 + 4 + 20 * config.index_entries <= 2**31 - 1


def test_missing_broker_config(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read broker config"):
        load_broker_config(tmp_path / "absent.conf")


def test_cq_size_rounding() -> None:
    assert round_consumequeue_size(6_000_000) == 6_000_000
    assert round_consumequeue_size(1) == 20
    assert round_consumequeue_size(41) == 60


def test_geometry_comes_from_options_then_files_then_defaults(oracle, tmp_path: Path) -> None:
    with Store.open_read(oracle("s1_multi").store) as store:
        assert store.commitlog_file_size == 65536
        assert store.consumequeue_file_size == 2000
        assert store.config.sources["commitlog_file_size"] == "existing files"
    with Store.open_write(tmp_path / "new", create=True) as store:
        assert store.commitlog_file_size == 1024**3
        assert store.consumequeue_file_size == 6_000_000
    config = StoreConfig().with_overrides(commitlog_file_size=8192, index_slots=None)
    assert config.commitlog_file_size == 8192 and config.sources == {
        "commitlog_file_size": "option"
    }


def test_a_queue_file_size_is_the_most_common_one_counted_until_it_clearly_leads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consume-queue file size a store's files tell: the most common size of the queues'
    first files, so a few damaged files cannot skew it (queues first in order too); the
    folders are listed until one size leads every other by 32, not all of them."""
    import os

    from rmqstore import geometry

    root = tmp_path / "consumequeue"

    def queue(topic: str, size: int) -> None:
        folder = root / topic / "0"
        folder.mkdir(parents=True)
        with (folder / "00000000000000000000").open("wb") as file:
            file.truncate(size)

    for number in range(20):  # damaged ones first: the first folders in order
        queue(f"A{number:03d}", 2000 + 20 * (number % 2))
    for number in range(300):
        queue(f"B{number:03d}", 6_000_000)
    listed: list[str] = []
    real_scandir = os.scandir

    def scandir(path: str):  # the listings made, for real
        listed.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(geometry.os, "scandir", scandir)
    assert geometry._infer_file_size(root, 2, geometry._QUEUE_SIZES, 20) == 6_000_000
    queues_listed = [path for path in listed if path.endswith(os.sep + "0")]
    # 10 + 10 of the damaged sizes, then 42 of the common one: a lead of 32
    assert len(queues_listed) == 20 + 42
    listed.clear()
    for number in range(5):
        queue(f"C{number:03d}", 4000)  # after the others: counted only if the count goes on
    assert geometry._infer_file_size(root, 2, geometry._QUEUE_SIZES, 20) == 6_000_000
    assert len([path for path in listed if path.endswith(os.sep + "0")]) == 62
    # a store of one queue, and of queues too few to lead by 32: all counted
    assert (
        geometry._infer_file_size(tmp_path / "consumequeue" / "C000", 1, geometry._QUEUE_SIZES, 20)
        == 4000
    )


def test_of_two_commit_log_files_the_whole_one_tells_the_size(tmp_path: Path) -> None:
    """A store of two files, the first cut short: its size is the other file's, so the
    short one is the one called wrong (it was the first's: the whole file was called the
    wrong size)."""
    from rmqstore import geometry

    root = tmp_path / "commitlog"
    root.mkdir()
    for name, size in ((0, 4023), (65536, 65536)):
        with (root / f"{name:020d}").open("wb") as file:
            file.truncate(size)
    assert geometry._infer_file_size(root, 0, geometry._COMMITLOG_SIZES) == 65536


@pytest.mark.parametrize("value", [0, 4095, 2**31, True, "4096"])
def test_a_remembered_size_no_broker_takes_is_a_format_error(tmp_path: Path, value) -> None:
    import json

    from rmqstore.errors import StoreFormatError
    from rmqstore.geometry import geometry_path, read_geometry

    geometry_path(tmp_path).parent.mkdir()
    geometry_path(tmp_path).write_text(json.dumps({"mappedFileSizeCommitLog": value}))
    with pytest.raises(StoreFormatError, match="mappedFileSizeCommitLog must be an integer"):
        read_geometry(tmp_path)
    for damaged in ("nul", "[4096]"):  # each error says how to get past it
        geometry_path(tmp_path).write_text(damaged)
        with pytest.raises(StoreFormatError, match=r"move it aside and give the sizes"):
            read_geometry(tmp_path)
    geometry_path(tmp_path).write_text(json.dumps({"mappedFileSizeCommitLog": 4096}))
    assert read_geometry(tmp_path) == {"commitlog_file_size": 4096}


def test_an_index_geometry_is_refused_exactly_when_its_files_pass_2_gib() -> None:
    from rmqstore.config import JAVA_INT_MAX, check_index_geometry
    from rmqstore.indexfile import index_file_size

    for slots, entries in ((1, 107_374_180), (1, 107_374_181), (536_870_901, 2), (5_000_000, 4)):
        fits = index_file_size(slots, entries) <= JAVA_INT_MAX
        try:
            check_index_geometry(slots, entries)
        except InputError:
            assert not fits
        else:
            assert fits


def test_writers_refuse_an_index_of_more_than_a_page_of_slots_an_entry(
    oracle, tmp_path: Path
) -> None:
    """The default 5,000,000 slots (20 MB a file, reserved whole by a writer) with two
    entries a file: ``replicate`` of a 3,000-message store filled 75 GB of disk in a minute
    (the options campaign, seed 25). Writers refuse such a geometry before they change
    anything; readers take it, as a broker does."""
    from rmqstore.config import check_index_reservation

    check_index_reservation(2048, 2)
    check_index_reservation(5_000_000, 4883)
    for slots, entries in ((2049, 2), (5_000_000, 4882), (5_000_000, 2)):
        with pytest.raises(InputError, match="would reserve"):
            check_index_reservation(slots, entries)
    store = oracle("s1_multi").copy_to(tmp_path)
    before = sorted(path.name for path in store.rglob("*"))
    wide = StoreConfig(index_slots=5_000_000, index_entries=2)
    with pytest.raises(InputError, match="give at most 2,048 slots, or at least 4,883 entries"):
        Store.open_write(tmp_path / "new", wide, create=True)
    assert not (tmp_path / "new").exists()
    with Store.open_read(store, wide) as opened:
        assert opened.config.index_entries == 2
    assert sorted(path.name for path in store.rglob("*")) == before


# The pieces random broker.conf lines are made of: a key's usual value, then characters that
# Properties.load, Integer.parseInt, Boolean.parseBoolean, String.trim and the delay table's
# parse read otherwise than Python's own readers (a no-break space and U+0085 in UTF-8 or as
# one ISO 8859-1 byte, other scripts' digits, \uXXXX escapes whole and broken, line
# continuations, CR line ends, vertical tab)
_AWKWARD = [
    b" ", b"\t", b"\f", b"\x0b", b"\x1c", b"\xc2\xa0", b"\xa0", b"\x85", b"\xc2\x85",
    b"\\u0036", b"\\u00", b"\\uzzzz", b"\\\n   ", b"\\\r\n\t", b"\\\\", b"\\t", b"+", b"-",
    b"_", "٦".encode(), "𝟔".encode(), "集".encode(), b"x", b"0",
]  # fmt: skip
_CONF_KEYS = {
    "mappedFileSizeCommitLog": [b"65536", b"1073741824", b"4096", b"99999999999"],
    "checkCRCOnRecover": [b"true", b"false", b"TRUE", b"False", b"yes", b"1"],
    "brokerClusterName": [b"Prod", "集群".encode(), b"\\u96c6\\u7fa4", b"a b"],
    "flushDiskType": [b"SYNC_FLUSH", b"ASYNC_FLUSH", b"sync_flush"],
    "messageDelayLevel": [b"1s 5s 10m", b"1s  5s", b"2d 99999999999999999d", b"0s -3s"],
}
_NOISE = [b"# a comment\\", b"! another", b"", b"   ", b"\f other = 1", b"other=2\\"]
_SEPARATORS = [b"=", b":", b" ", b" = ", b"\t:", b"  "]
_LINE_ENDS = [b"\n", b"\r\n", b"\r", b""]

_READ_AS_A_BROKER = r"""
import java.io.*; import java.util.*;
public class Conf {
  enum FlushDiskType { SYNC_FLUSH, ASYNC_FLUSH }
  static String hex(String s) {
    StringBuilder b = new StringBuilder();
    for (char c : s.toCharArray()) b.append(String.format("%04x", (int) c));
    return b.toString(); }
  static String read(String key, String v) {
    switch (key) {
      case "mappedFileSizeCommitLog":
        try { return "INT " + Integer.parseInt(v); } catch (NumberFormatException e) {
          return "IGNORED"; }
      case "checkCRCOnRecover":
        return "BOOL " + Boolean.parseBoolean(v) + " "
          + (v.equalsIgnoreCase("true") || v.equalsIgnoreCase("false"));
      case "brokerClusterName": return "TEXT " + hex(v.trim());
      case "flushDiskType":
        try { return "FLUSH " + FlushDiskType.valueOf(v.trim()).name(); }
        catch (IllegalArgumentException e) { return "IGNORED"; }
      default:
        Map<String, Long> units = new HashMap<>();
        units.put("s", 1000L); units.put("m", 60000L); units.put("h", 3600000L);
        units.put("d", 86400000L);
        try {
          StringBuilder b = new StringBuilder("DELAY");
          for (String item : v.trim().split(" ")) {
            Long unit = units.get(item.substring(item.length() - 1));
            long number = Long.parseLong(item.substring(0, item.length() - 1));
            long millis = unit * number;
            b.append(' ').append(millis); }
          return b.toString();
        } catch (Exception e) { return "FAIL"; } } }
  public static void main(String[] a) throws Exception {
    File[] files = new File(a[0]).listFiles(); Arrays.sort(files);
    StringBuilder out = new StringBuilder();
    for (File f : files) {
      String key = f.getName().split("[.]")[1];
      Properties p = new Properties(); String said;
      try (InputStream in = new BufferedInputStream(new FileInputStream(f))) {
        p.load(in);
        String v = p.getProperty(key);
        said = v == null ? "ABSENT" : read(key, v);
      } catch (IllegalArgumentException e) { said = "LOADFAIL"; }
      out.append(f.getName()).append(' ').append(said).append('\n'); }
    System.out.print(out); } }
"""


def _random_conf(rng: random.Random, key: str) -> bytes:
    value = bytearray(rng.choice(_CONF_KEYS[key]))
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        at = rng.randint(0, len(value))
        value[at:at] = rng.choice(_AWKWARD)
    lines = [rng.choice(_NOISE) for _ in range(rng.randint(0, 2))]
    lines.append(key.encode() + rng.choice(_SEPARATORS) + bytes(value))
    lines += [rng.choice(_NOISE) for _ in range(rng.randint(0, 1))]
    ends = [rng.choice(_LINE_ENDS[:3]) for _ in lines[:-1]] + [rng.choice(_LINE_ENDS)]
    return b"".join(line + end for line, end in zip(lines, ends, strict=True))


def _rmqstore_reading(conf: Path, key: str) -> str:
    """What rmqstore takes from ``conf`` for ``key``, in the words the Java program uses."""
    field = {
        "mappedFileSizeCommitLog": "commitlog_file_size",
        "checkCRCOnRecover": "check_crc_on_recover",
        "brokerClusterName": "cluster_name",
        "flushDiskType": "flush_disk_type",
        "messageDelayLevel": "message_delay_level",
    }[key]
    try:
        config = load_broker_config(conf)
        if field not in config.sources:
            return "ABSENT"
        value = getattr(config, field)
        if key == "messageDelayLevel":
            return " ".join(["DELAY", *map(str, DelayLevels(value).millis)])
    except InputError:
        return "REFUSED"
    if key == "brokerClusterName":
        return "TEXT " + value.encode("utf-16-be").hex()
    return {"mappedFileSizeCommitLog": "INT", "checkCRCOnRecover": "BOOL"}.get(
        key, "FLUSH"
    ) + f" {str(value).lower() if isinstance(value, bool) else value}"


def _expected(said: str) -> str:
    """What rmqstore should take where a broker's Java said ``said``: the same value, or a
    refusal where the broker ignores the value, reads a word that is not true as false,
    does not start (a malformed escape, a delay table it cannot parse), or takes a file
    size no broker can use."""
    kind, _, rest = said.partition(" ")
    if kind in ("IGNORED", "LOADFAIL", "FAIL"):
        return "REFUSED"
    if kind == "BOOL":
        value, word = rest.split()
        return f"BOOL {value}" if word == "true" else "REFUSED"
    if kind == "INT" and not 4096 <= int(rest) <= 2**31 - 1:
        return "REFUSED"
    if said == "TEXT ":  # a value of nothing but spaces sets no cluster name here
        return "ABSENT"
    return said


def test_broker_config_is_read_as_a_brokers_java_reads_it(tmp_path: Path) -> None:
    """Random broker.conf files read by the JVM's own Properties.load, Integer.parseInt,
    Boolean.parseBoolean, String.trim and the delay table's parse, and by rmqstore: the
    same value for every key, or a refusal where a broker would not take what the file
    says (it used to read the file as UTF-8, split lines at U+0085, strip a no-break space
    and take 65536 with a space after it, which a broker ignores)."""
    javac = shutil.which("javac")
    if javac is None:
        pytest.skip("no javac (a JDK) on PATH")
    (tmp_path / "Conf.java").write_text(_READ_AS_A_BROKER)
    subprocess.run([javac, "-d", str(tmp_path), str(tmp_path / "Conf.java")], check=True)
    confs = tmp_path / "confs"
    confs.mkdir()
    rng = random.Random(20261202)
    keys = sorted(_CONF_KEYS)
    for number in range(3000):
        key = keys[number % len(keys)]
        (confs / f"{number:05d}.{key}").write_bytes(_random_conf(rng, key))
    done = subprocess.run(
        ["java", "-cp", str(tmp_path), "Conf", str(confs)],
        capture_output=True,
        text=True,
        check=True,
    )
    outcomes = [line.split(" ", 1) for line in done.stdout.splitlines()]
    assert len(outcomes) == 3000
    kinds = set()
    for name, said in outcomes:
        key = name.split(".")[1]
        kinds.add(said.split(" ")[0])
        assert _rmqstore_reading(confs / name, key) == _expected(said), (
            name,
            (confs / name).read_bytes(),
            said,
        )
    assert kinds >= {"INT", "BOOL", "TEXT", "FLUSH", "DELAY", "IGNORED", "LOADFAIL", "FAIL"}
