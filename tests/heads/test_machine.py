import platform

from specheads.core.machine import cpuinfo_field, processor_name

CPUINFO = "processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: Other\n"


def test_the_first_processors_field_is_read_by_its_whole_name(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    assert cpuinfo_field("model name", str(cpuinfo)) == "Some CPU @ 2.0GHz"
    assert cpuinfo_field("flags", str(cpuinfo)) == "fpu avx2"
    assert cpuinfo_field("model", str(cpuinfo)) is None  # a prefix of "model name" is not that field
    assert processor_name(str(cpuinfo)) == "Some CPU @ 2.0GHz"


def test_without_cpuinfo_the_name_is_what_platform_knows(tmp_path):
    missing = str(tmp_path / "no-cpuinfo")
    assert cpuinfo_field("flags", missing) is None
    assert processor_name(missing) == (platform.processor() or platform.machine())
