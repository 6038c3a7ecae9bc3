import pytest

from hpc_train.config.slurm_time import format_slurm_time, parse_slurm_time


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 5400),
        (30, 1800),
        ("10:30", 630),
        ("12:00:00", 43200),
        ("36:00:00", 129600),
        ("2-00", 172800),
        ("1-12:30", 131400),
        ("7-00:00:00", 604800),
    ],
)
def test_parses_every_slurm_format(text, seconds):
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", ["12h", "1:2:3:4", "", "abc", "1-25:00:00", "10:75", "0", "-5", "00:00:00"])
def test_rejects_malformed_times_with_the_formats(text):
    with pytest.raises(ValueError) as info:
        parse_slurm_time(text)
    assert "expected" in str(info.value) or "HH:MM:SS" in str(info.value)


def test_formats_canonically():
    assert format_slurm_time(43200) == "12:00:00"
    assert format_slurm_time(604800) == "7-00:00:00"
    assert format_slurm_time(parse_slurm_time("1-2:3:4")) == "1-02:03:04"


def test_a_time_longer_than_slurm_can_hold_is_refused_with_the_longest():
    from hpc_train.config.slurm_time import MAX_SECONDS, format_slurm_time

    assert parse_slurm_time(format_slurm_time(MAX_SECONDS)) == MAX_SECONDS
    for value in (MAX_SECONDS // 60 + 1, "9999999-00:00:00"):
        with pytest.raises(ValueError, match=r"longer than Slurm can hold \(at most 2982616-04:13:00\)"):
            parse_slurm_time(value)
