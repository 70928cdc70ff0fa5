"""Running work: the worker loop, device leases, frame launch and usage sampling.

Each module has one job (docs/architecture.md lists them all); the frame launch is split so:

- ``frame/env``: what one frame attempt is (``FrameContext``) and the environment it runs with;
- ``frame/tokens``: a layer command's ``#TOKEN#``s replaced by one frame's values, quoted for the shell;
- ``frame/start``: starting a frame's command as its user (``RunAs``), in its directory;
- ``frame/process``: one supervised attempt (``FrameProcess``) and how it ended (``ExitInfo``);
- ``procs``: process groups, the child subreaper and what a frame leaves behind (light: ``cuectl run`` uses it);
- ``framelog/``: everything about one attempt's log file — its name, safe open for writing and
  reading, the size cap, header/footer notes, the tail and the one follower (CLI and API);
- ``launch``: a face re-exporting what the worker and ``cuectl run`` use of the above;
- ``logs``: ``cuectl frame log`` across a frame's attempts, and OpenCue's ``rqlog`` names.
"""
