"""`cuectl serve --opencue` as a whole: what no single handler decides."""

from __future__ import annotations


def test_log_dirs_are_absolute_for_a_store_named_relatively(tmp_path, monkeypatch):
    """CueGUI opens Job.log_dir and Proc.log_path from its own working directory."""
    import subprocess

    import grpc
    from cuebotlib import cuectl_cmd, start_server, subprocess_env
    from opencue_proto import job_pb2, job_pb2_grpc

    monkeypatch.chdir(tmp_path)
    subprocess.run(
        [*cuectl_cmd(), "--db", "rel.db", "submit", "--name", "j", "--", "true"],
        check=True,
        capture_output=True,
        env=subprocess_env(),
    )
    server = start_server("rel.db")
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = job_pb2_grpc.JobInterfaceStub(channel)
            [found] = stub.GetJobs(job_pb2.JobGetJobsRequest(r=job_pb2.JobSearchCriteria()), timeout=10).jobs.jobs
        assert found.log_dir.startswith(str(tmp_path)) and found.log_dir.endswith("/rqlog"), found.log_dir
    finally:
        server.stop()
