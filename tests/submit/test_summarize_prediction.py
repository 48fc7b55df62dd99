"""`jobs describe --summarize` of a batch prediction job shows its prediction input and
output, and no (empty) training section."""
from submit import jobs
from tests.support.submit_cli import run


def test_a_prediction_jobs_summary_has_prediction_sections_only(capsys):
    record = jobs.JobRecord("pred1", state=jobs.SUCCEEDED, mode="prediction",
                            prediction_input={"dataFormat": "JSON", "inputPaths": ["in/*"],
                                              "outputPath": "out", "region": "us-central1",
                                              "modelName": "fashion"})
    record.prediction_output = {"outputPath": "out", "predictionCount": "6",
                                "errorCount": "1"}
    jobs.save(record)
    status, out, err = run(capsys, "jobs", "describe", "pred1", "--summarize")
    assert status == 0, err
    assert "Training" not in out
    lines = out.splitlines()
    at = lines.index("Prediction Input Summary")
    assert lines[at + 1].split()[:2] == ["MODEL_NAME", "DATA_FORMAT"]
    assert "fashion" in lines[at + 2] and "us-central1" in lines[at + 2]
    at = lines.index("Prediction Output Summary")
    assert lines[at + 1].split() == ["PREDICTION_COUNT", "ERROR_COUNT", "OUTPUT_PATH"]
    assert lines[at + 2].split() == ["6", "1", "out"]
