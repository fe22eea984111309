"""Cloud Composer (Apache Airflow) DAG: launch the image-tfrecords Flex Template every night.

Each run launches the template built from configs/flex_template/ (docs/scheduling.md). The
launcher lists the inputs and compares their fingerprint with the version ROOT/LATEST names.
Changed inputs: the job writes ROOT/versions/<UTC time>/ and publishes it by writing
ROOT/LATEST last, so training jobs never see a half-written version; --keep_versions prunes
old versions after a successful publish. Unchanged inputs: the launcher submits a one-worker
no-op job that logs "up to date" and succeeds, so the task succeeds (no retry, no alert).

Retries: only failures worth it. A job that failed in a way the same launch repeats (too
many rejected inputs: the CLI's exit status 3, docs/scheduling.md) fails the task for good,
with no retry; any other failure (storage unavailable past the retries, a worker lost, a
launch while another build holds the root) is retried once, 15 minutes later.

Set these Airflow Variables (Admin > Variables, or `gcloud composer environments run ENV
--location REGION variables set -- NAME VALUE`); they are read when the task runs, not when
the scheduler parses this file:
  image_tfrecords_project        GCP project that runs the Dataflow job
  image_tfrecords_region         Dataflow region, e.g. us-central1
  image_tfrecords_template       gs://BUCKET/templates/image-tfrecords.json (the template spec)
  image_tfrecords_input          gs://BUCKET/images (directory, glob or CSV/JSONL manifest)
  image_tfrecords_output         gs://BUCKET/datasets/images (the dataset root)
  image_tfrecords_temp_location  gs://BUCKET/tmp
  image_tfrecords_worker_image   REGION-docker.pkg.dev/PROJECT/dataflow/image-tfrecords-worker
                                 @sha256:… (by digest, or by the tag docker/image_tag.py
                                 derives from the code and constraints; never a reused tag
                                 like :2.77.0, which a push can move while a job runs)

Copy this file into the environment's dags/ folder:
  gcloud composer environments storage dags import --environment ENV --location REGION \
      --source configs/airflow/image_tfrecords_dag.py
"""

import datetime

from airflow.exceptions import AirflowFailException
from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator

try:  # Airflow 3 (Composer 3)
    from airflow.sdk import DAG
except ImportError:  # Airflow 2
    from airflow import DAG

# One entry per parameter of configs/flex_template/metadata.json (the CLI's build options),
# all strings as the launch API wants them. Empty values are left out of the launch, so an
# optional parameter keeps the CLI default (and its regex is not applied to "").
TEMPLATE_PARAMETERS = {
    "input": "{{ var.value.image_tfrecords_input }}",
    "output": "{{ var.value.image_tfrecords_output }}",
    "name": "images",
    "splits": "train=0.8,validation=0.1,test=0.1",
    "num_shards": "0",
    "target_shard_mb": "128",
    "max_side": "0",
    "validate": "decode",
    "reencode": "auto",
    "jpeg_quality": "90",
    "max_pixels": "89478485",
    "max_image_mb": "1024",
    "max_error_rate": "0.01",
    "label_file": "",
    "schema": "",
    "sink": "shards",
    "write_index": "true",
    "transform": "false",
    "transform_image_size": "224",
    "force": "false",
    "drop_content_duplicates": "false",
    "near_duplicates": "false",
    "near_duplicate_radius": "8",
    "drop_near_duplicate_leaks": "false",
    "full_rebuild": "false",
    "resplit": "false",
    "verify_inputs": "false",
    "max_delta_share": "0.25",
    "wait": "false",
    "keep_versions": "7",
    "keep_superseded_hours": "48",
    "max_hours": "20",  # Dataflow cancels the job after this; the lock expires then too
    "verbose": "false",
}

# The task gives up an hour after the job's own bound (max_hours): the job is cancelled by
# Dataflow at max_hours, so this only catches a launch that never returns.
EXECUTION_TIMEOUT = datetime.timedelta(hours=float(TEMPLATE_PARAMETERS["max_hours"]) + 1)

# FlexTemplateRuntimeEnvironment: where the job's temp files go, and labels. Machine type,
# worker counts, disk and experiments come from configs/dataflow.yaml in the launcher image
# (the one place for them); add "machineType", "numWorkers" or "maxWorkers" here only to
# override it for this DAG. The worker image is named here, immutably (the Variable above).
ENVIRONMENT = {
    "tempLocation": "{{ var.value.image_tfrecords_temp_location }}",
    "sdkContainerImage": "{{ var.value.image_tfrecords_worker_image }}",
    "additionalUserLabels": {"dataset": "image-tfrecords"},
}

# What a job that failed for good says in its error (beam_pipeline/cli.py NO_RETRY_NAMES:
# the CLI's exit status 3). Retrying it would fail the same way, a night's workers later.
NO_RETRY = ("ErrorRateExceeded",)


def retry_will_not_help(task):
    """Whether the failed Dataflow job of `task` says it failed for good (NO_RETRY in its
    messages). Unknown (no job, messages unreadable): False, so it is retried."""
    from airflow.providers.google.cloud.hooks.dataflow import DataflowHook

    job = getattr(task, "job", None) or {}
    job_id = job.get("id") if isinstance(job, dict) else None
    if not job_id:
        return False
    try:
        messages = DataflowHook(gcp_conn_id=task.gcp_conn_id).fetch_job_messages_by_id(
            job_id=job_id, project_id=task.project_id, location=task.location)
    except Exception:
        return False
    return any(name in (m.get("messageText") or "") for m in messages for name in NO_RETRY)


class LaunchImageTfrecords(DataflowStartFlexTemplateOperator):
    """The Flex Template launch, retried only when a retry may help (NO_RETRY)."""

    def execute(self, context):
        try:
            return super().execute(context)
        except Exception as e:
            if retry_will_not_help(self):
                raise AirflowFailException(
                    f"{e} (the job failed in a way a retry repeats: {', '.join(NO_RETRY)}; "
                    "fix the inputs or the options, then clear the task)") from e
            raise


with DAG(
    dag_id="image_tfrecords_nightly",
    description="Rebuild the image TFRecord dataset from new images (Dataflow Flex Template)",
    schedule="0 2 * * *",  # 02:00 UTC every night
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # never two builds at once (the publish guard would refuse the older)
    default_args={"retries": 1, "retry_delay": datetime.timedelta(minutes=15)},
    tags=["dataflow", "tfrecords"],
) as dag:
    LaunchImageTfrecords(
        task_id="launch_image_tfrecords",
        project_id="{{ var.value.image_tfrecords_project }}",
        location="{{ var.value.image_tfrecords_region }}",
        body={
            "launchParameter": {
                "jobName": "image-tfrecords-{{ ds_nodash }}",
                "containerSpecGcsPath": "{{ var.value.image_tfrecords_template }}",
                "parameters": {k: v for k, v in TEMPLATE_PARAMETERS.items() if v != ""},
                "environment": ENVIRONMENT,
            }
        },
        wait_until_finished=True,
        execution_timeout=EXECUTION_TIMEOUT,
    )
