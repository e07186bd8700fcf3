"""``loadtest.promtext.read_samples`` / ``sample_sum`` on Triton-style and gateway-style text."""

from __future__ import annotations

from loadtest.promtext import read_samples, sample_sum

TEXT = """\
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="bert_qa",reason="CANCELED",version="1"} 3
nv_inference_request_failure{model="bert_qa",reason="BACKEND",version="1"} 2
nv_inference_request_failure{model="other",reason="CANCELED",version="1"} 7
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="bert_qa",version="1"} 4
# TYPE qa_request_duration_seconds histogram
qa_request_duration_seconds_bucket{route="/v1/qa",outcome="ok",le="+Inf"} 5
qa_request_duration_seconds_count{route="/v1/qa",outcome="ok"} 5
qa_request_duration_seconds_sum{route="/v1/qa",outcome="ok"} 0.5
"""


def test_counters_read_back_with_total_and_labels_select_series() -> None:
    samples = read_samples(TEXT)
    key = ("nv_inference_request_failure_total",
           frozenset({("model", "bert_qa"), ("reason", "CANCELED"), ("version", "1")}))
    assert samples[key] == 3
    assert sample_sum(samples, "nv_inference_request_failure_total", model="bert_qa") == 5
    assert sample_sum(samples, "nv_inference_request_failure_total", reason="CANCELED") == 10
    assert sample_sum(samples, "nv_inference_request_failure") == 0  # the name as written
    assert sample_sum(samples, "nv_inference_pending_request_count", model="bert_qa") == 4
    assert sample_sum(samples, "qa_request_duration_seconds_count", outcome="ok") == 5
    assert sample_sum(samples, "qa_request_duration_seconds_count", outcome="internal") == 0
