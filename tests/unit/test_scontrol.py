"""``scontrol show`` records (hpc_train.scontrol), from output as Slurm 23.02 writes it, and its callers."""

from __future__ import annotations

import subprocess

import pytest

from hpc_train import scontrol
from hpc_train.jobs.handle import JobHandle, JobRecord
from hpc_train.runtime.lifecycle import preemption
from hpc_train.runtime.supervise import between_runs
from hpc_train.submission import slurm_cmd

# show job -o: a requeued job on its BeginTime hold; a job name and paths with spaces, TRES with "="
JOB = (
    "JobId=4242 JobName=train run UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=4294901758 Nice=0 "
    "Account=proj QOS=normal JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=01:00:00 TimeMin=N/A SubmitTime=2024-05-01T10:00:00 "
    "EligibleTime=2024-05-01T10:02:01 AccrueTime=Unknown StartTime=2024-05-01T10:02:01 EndTime=2024-05-01T11:02:01 "
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2024-05-01T10:00:01 Scheduler=Main Partition=gpu "
    "AllocNode:Sid=login1:4242 ReqNodeList=(null) ExcNodeList=gpu07 NodeList=(null) NumNodes=2-2 NumCPUs=16 "
    "NumTasks=2 CPUs/Task=8 ReqB:S:C:T=0:0:*:* ReqTRES=cpu=16,mem=64G,node=2,billing=16,gres/gpu=8 AllocTRES=(null) "
    "Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* MinCPUsNode=8 MinMemoryNode=32G MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=NO Contiguous=0 Licenses=(null) Network=(null) "
    "Command=/home/alice/my project/hpc_train.sbatch WorkDir=/home/alice/my project StdErr=/home/alice/jobs/4242/%j.err "
    "StdIn=/dev/null StdOut=/home/alice/jobs/4242/%j.out Power= TresPerNode=gres/gpu:4\n"
)

# show node (no -o): indented continuation lines, trailing spaces, a Reason with spaces and key=value words
NODES = "\n".join(
    [
        "NodeName=gpu07 Arch=x86_64 CoresPerSocket=32 ",
        "   CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.02",
        "   AvailableFeatures=a100,ib",
        "   ActiveFeatures=a100,ib",
        "   Gres=gpu:a100:4(S:0-1)",
        "   NodeAddr=gpu07 NodeHostName=gpu07 Version=23.02.7",
        "   OS=Linux 5.14.0-362.8.1.el9_3.x86_64 #1 SMP PREEMPT_DYNAMIC Tue Oct 3 11:12:36 EDT 2023 ",
        "   RealMemory=512000 AllocMem=0 FreeMem=498000 Sockets=2 Boards=1",
        "   State=DOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
        "   Partitions=gpu ",
        "   CfgTRES=cpu=64,mem=500G,billing=64,gres/gpu=4",
        "   AllocTRES=",
        "   Reason=Node unexpectedly rebooted boot_time=1714464000 last_response=1714463990 [slurm@2024-05-01T09:30:00]",
        "",
        "NodeName=gpu08 Arch=x86_64 CoresPerSocket=32 ",
        "   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
        "   Partitions=gpu ",
        "",
        "",
    ]
)

PARTITION = (
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A "
    "DefaultTime=NONE MaxNodes=UNLIMITED MaxTime=2-00:00:00 MinNodes=0 Nodes=gpu[01-08] State=UP TotalCPUs=512 "
    "TotalNodes=8 TRES=cpu=512,mem=4000G,node=8,billing=512,gres/gpu=32\n"
)


# -- parsing ---------------------------------------------------------------------------------------
def test_a_one_line_job_keeps_values_with_spaces_and_equals_signs():
    job = scontrol.first(JOB)
    assert (job["JobId"], job["JobState"], job["Reason"], job["Restarts"]) == ("4242", "PENDING", "BeginTime", "1")
    assert job["JobName"] == "train run"
    assert job["Command"] == "/home/alice/my project/hpc_train.sbatch"
    assert job["WorkDir"] == "/home/alice/my project"
    assert job["ReqTRES"] == "cpu=16,mem=64G,node=2,billing=16,gres/gpu=8"
    assert (job["CPUs/Task"], job["ReqB:S:C:T"], job["AllocNode:Sid"], job["MCS_label"]) == ("8", "0:0:*:*", "login1:4242", "N/A")
    assert job["Power"] == "" and job["TresPerNode"] == "gres/gpu:4"  # an empty value ends at the next key
    assert "cpu" not in job and "mem" not in job  # TRES items are part of the value, not fields


def test_a_missing_key_is_absent_not_empty():
    job = scontrol.first(JOB)
    assert "BatchHost" not in job and job.get("BatchHost") is None  # a pending job has no batch host yet
    assert scontrol.first("") == {}
    assert scontrol.records("No jobs in the system\n") == []  # what scontrol prints when there are none


def test_multi_line_records_end_at_a_blank_line():
    first, second = scontrol.records(NODES)
    assert (first["NodeName"], first["State"], first["Partitions"]) == ("gpu07", "DOWN+DRAIN+NOT_RESPONDING", "gpu")
    assert first["CoresPerSocket"] == "32"  # the trailing space before the line break is not the value's
    assert first["OS"] == "Linux 5.14.0-362.8.1.el9_3.x86_64 #1 SMP PREEMPT_DYNAMIC Tue Oct 3 11:12:36 EDT 2023"
    assert first["AllocTRES"] == ""
    # Slurm's own reason text holds lower-case key=value words: they stay in the value
    assert first["Reason"] == (
        "Node unexpectedly rebooted boot_time=1714464000 last_response=1714463990 [slurm@2024-05-01T09:30:00]"
    )
    assert "boot_time" not in first
    assert (second["NodeName"], second["State"]) == ("gpu08", "IDLE") and "Reason" not in second


def test_one_line_records_are_one_per_line_and_first_is_the_first_task():
    array = JOB.replace("JobId=4242 ", "JobId=4243 ArrayJobId=4243 ArrayTaskId=0 ") + JOB.replace(
        "JobId=4242 ", "JobId=4244 ArrayJobId=4243 ArrayTaskId=1 "
    )
    tasks = scontrol.records(array)
    assert [t["ArrayTaskId"] for t in tasks] == ["0", "1"]
    assert scontrol.first(array)["JobId"] == "4243"
    assert scontrol.first(PARTITION)["TotalNodes"] == "8"


# -- running it (the job side) ---------------------------------------------------------------------
def fake_run(monkeypatch, outcome):
    calls: list[list[str]] = []

    def run(cmd, **kw):
        calls.append(cmd)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(scontrol.subprocess, "run", run)
    return calls


def test_show_asks_for_one_line_records(monkeypatch):
    calls = fake_run(monkeypatch, subprocess.CompletedProcess([], 0, PARTITION, ""))
    assert scontrol.show("partition", "gpu")["Nodes"] == "gpu[01-08]"
    assert calls == [["scontrol", "show", "partition", "-o", "gpu"]]


@pytest.mark.parametrize(
    "outcome",
    [
        subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Invalid job id specified\n"),
        FileNotFoundError("scontrol"),  # not a Slurm node
        subprocess.TimeoutExpired("scontrol", 30),  # the controller does not answer
    ],
)
def test_show_is_empty_when_the_controller_cannot_be_asked(monkeypatch, outcome):
    fake_run(monkeypatch, outcome)
    assert scontrol.show("job", "4242") == {}


# -- what the callers read -------------------------------------------------------------------------
def test_health_reads_the_jobs_and_its_partitions_nodes(monkeypatch):
    answers = {("job", "4242"): scontrol.first(JOB), ("partition", "gpu"): scontrol.first(PARTITION)}
    monkeypatch.setattr(scontrol, "show", lambda entity, name, timeout=30: answers.get((entity, name), {}))
    assert between_runs.partition_nodes("4242") == (2, 8, {"gpu07"})
    answers[("job", "4242")] = scontrol.first(JOB.replace("ExcNodeList=gpu07", "ExcNodeList=(null)"))
    assert between_runs.partition_nodes("4242") == (2, 8, set())
    del answers[("partition", "gpu")]  # a missing TotalNodes: nothing known, no exclusion planned
    assert between_runs.partition_nodes("4242") is None


def test_preemption_does_not_requeue_a_job_requeued_already(monkeypatch):
    calls = fake_run(monkeypatch, subprocess.CompletedProcess([], 0, JOB, ""))
    done, message = preemption.requeue("4242", environ={"SLURM_RESTART_COUNT": "0"})
    assert done and "already being requeued" in message and "PENDING" in message
    assert calls == [["scontrol", "show", "job", "-o", "4242"]]  # no `scontrol requeue` after it


def test_the_handle_reads_the_controllers_fields(monkeypatch, tmp_path):
    outputs = iter(
        [
            subprocess.CompletedProcess([], 0, JOB, ""),
            subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Invalid job id specified\n"),
        ]
    )
    monkeypatch.setattr(slurm_cmd.subprocess, "run", lambda cmd, **kw: next(outputs))
    handle = JobHandle(
        JobRecord(
            job_id="4242",
            folder=str(tmp_path),
            scheduler="slurm",
            kind="script",
            site="sandbox",
            backend="torchrun",
            nodes=2,
            procs_per_node=4,
            tasks_per_node=1,
            job_name="t",
        )
    )
    info = handle.scheduler_info()
    assert (info["JobState"], info["Reason"], info["WorkDir"]) == ("PENDING", "BeginTime", "/home/alice/my project")
    assert handle.scheduler_info() == {}  # the controller has forgotten the job
