"""The determinism benchmark's table: medians per setting and their ratio, computed by hand here."""

from benchmarks import determinism


def test_the_table_gives_each_settings_medians_and_on_over_off():
    trials = {False: [{"rl_samples_per_s": 100.0, "sft_tokens_per_s": 1000.0},
                      {"rl_samples_per_s": 300.0, "sft_tokens_per_s": 3000.0},
                      {"rl_samples_per_s": 200.0, "sft_tokens_per_s": 2000.0}],
              True: [{"rl_samples_per_s": 150.0, "sft_tokens_per_s": 2500.0},
                     {"rl_samples_per_s": 250.0, "sft_tokens_per_s": 1500.0},
                     {"rl_samples_per_s": 50.0, "sft_tokens_per_s": 500.0}]}
    report = determinism.report(trials, steps=8, sft_steps=40, repeats=3)
    assert report.data["medians"] == {"false": {"rl_samples_per_s": 200.0, "sft_tokens_per_s": 2000.0},
                                      "true": {"rl_samples_per_s": 150.0, "sft_tokens_per_s": 1500.0}}
    assert report.data["ratio"] == {"rl_samples_per_s": 0.75, "sft_tokens_per_s": 0.75}
    assert report.rows[-1] == ["on / off", "0.75", "0.75", ""]
    assert report.rows[1][:3] == ["on (the tiny preset)", "150.0", "1,500"]
