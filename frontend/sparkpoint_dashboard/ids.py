"""Every component id of the dashboard, in one place (callbacks and browser tests use these)."""

# The shell: address bar, refresh clock, the operator's token, the banner, the page container.
URL = "url"
REFRESH = "refresh"
TOKEN_INPUT = "token-input"
TOKEN_STATE = "token-state"
BANNER = "api-banner"
PAGE = "page"
ROUTE = "route"  # a dcc.Store in each page's layout: the parsed route (job id, checkpoint id)
LAST_UPDATED = "last-updated"
TITLE = "page-title"  # dcc.Store: the browser tab's title for the page shown
TITLE_SINK = "page-title-sink"

# Jobs (/)
JOBS_GRID = "jobs-grid"
JOBS_MESSAGE = "jobs-message"

# Audit log (/audit): shown to an admin's token only
AUDIT_GRID = "audit-grid"
AUDIT_MESSAGE = "audit-message"
AUDIT_BODY = "audit-body"  # the grid's section; hidden without an admin's token

# Job header (on every page of a job): title, status, tabs
JOB_TITLE = "job-title"
JOB_STATUS_BADGE = "job-status-badge"
JOB_GUARANTEE = "job-guarantee"  # the end-to-end guarantee's badge and its reason

# Job overview (/jobs/{id})
JOB_CARDS = "job-cards"
JOB_STATUS_CHART = "job-status-chart"
JOB_STATUS_GRID = "job-status-grid"
JOB_THROUGHPUT_CHART = "job-throughput-chart"
JOB_EXCEPTIONS_GRID = "job-exceptions-grid"
JOB_VERTICES = "job-vertices"
JOB_MESSAGE = "job-message"
JOB_BODY = "job-body"  # everything below the header; hidden when the job is unknown
JOB_EXECUTORS_GRID = "job-executors-grid"  # the Spark application's executors and hosts
JOB_EXECUTORS_NOTE = "job-executors-note"

# Checkpoints (/jobs/{id}/checkpoints)
CP_COUNTS = "checkpoint-counts"
CP_LATEST = "checkpoint-latest"
CP_HISTORY_CHART = "checkpoint-history-chart"
CP_SUMMARY = "checkpoint-summary"
CP_HISTORY_GRID = "checkpoint-history-grid"
CP_MESSAGE = "checkpoints-message"

# One checkpoint (/jobs/{id}/checkpoints/{n})
CK_SUMMARY = "checkpoint-summary-card"
CK_FAILURE = "checkpoint-failure"
CK_OPERATORS_GRID = "checkpoint-operators-grid"
CK_TIMELINE = "checkpoint-timeline"
CK_STRAGGLERS = "checkpoint-stragglers"
CK_HANDLES_GRID = "checkpoint-handles-grid"
CK_SPARK_LINK = "checkpoint-spark-link"
CK_SPARK_GROUP = "checkpoint-spark-group"  # dcc.Store: {group, epoch} whose Spark jobs are shown
CK_SPARK_DONE = "checkpoint-spark-done"  # dcc.Store: the {group, epoch} whose links are final
CK_MESSAGE = "checkpoint-message"

# Actions (on the job's pages): each asks for confirmation, then shows its outcome
ACT_CHECKPOINT = "action-trigger-checkpoint"
ACT_SAVEPOINT = "action-trigger-savepoint"
ACT_SAVEPOINT_DIR = "action-savepoint-dir"
ACT_STOP = "action-stop-with-savepoint"
ACT_CANCEL = "action-cancel"
ACT_RESTORE_SELECT = "action-restore-select"
ACT_RESTORE = "action-restore"
ACT_CONFIRM = "action-confirm"  # dcc.ConfirmDialog
ACT_PENDING = "action-pending"  # dcc.Store: the action waiting for confirmation
ACT_FEEDBACK = "action-feedback"  # why an action was not sent (no token, nothing chosen, 4xx)
OPERATIONS = "operations"  # dcc.Store (session): the requests sent and their outcomes
OPERATIONS_LOG = "operations-log"
ACT_RESTORE_CHOICES = "action-restore-choices"  # dcc.Store: dropdown value -> what it restores

# Checkpoint configuration form (job overview)
CFG_INTERVAL = "config-interval"
CFG_TIMEOUT = "config-timeout"
CFG_MIN_PAUSE = "config-min-pause"
CFG_TOLERABLE = "config-tolerable"
CFG_RETAINED = "config-retained"
CFG_FIXED = "config-fixed"  # mode and max concurrent: shown, fixed until the next start
CFG_APPLY = "config-apply"
CFG_CURRENT = "config-current"
CFG_CONFIRM = "config-confirm"  # dcc.ConfirmDialog
CFG_PENDING = "config-pending"  # dcc.Store: the PATCH waiting for confirmation
CFG_FEEDBACK = "config-feedback"  # why Apply sent nothing, or what the API refused
CFG_LOADED = "config-loaded"  # dcc.Store: the configuration the form was filled from

# Restart strategy form (job overview)
RS_TYPE = "restart-type"
RS_PARAMS = "restart-params"  # holds {"type": RS_PARAM, "key": <Flink option>} inputs
RS_PARAM = "restart-param"
RS_APPLY = "restart-apply"
RS_CURRENT = "restart-current"
RS_CONFIRM = "restart-confirm"  # dcc.ConfirmDialog
RS_PENDING = "restart-pending"  # dcc.Store: the PUT waiting for confirmation
RS_FEEDBACK = "restart-feedback"  # why Apply sent nothing, or what the API refused (names the key)
RS_LOADED = "restart-loaded"  # dcc.Store: the strategy the form was filled from

# A job that ended (FINISHED, CANCELED, FAILED): its actions and forms are disabled, and say why
JOB_ENDED = "job-ended"  # dcc.Store: why the job cannot be steered any more, or None
ACT_ENDED_NOTE = "action-ended-note"
CFG_ENDED_NOTE = "config-ended-note"
ACT_RESTORE_NOTE = "action-restore-note"  # the chosen restore point went: what happened to it

# Savepoints page
SP_GRID = "savepoints-grid"
SP_MESSAGE = "savepoints-message"
SP_DISPOSE_SELECT = "savepoints-dispose-select"  # which savepoint to dispose of (its location)
SP_DISPOSE = "savepoints-dispose"
SP_DISPOSE_CONFIRM = "savepoints-dispose-confirm"
SP_DISPOSE_PENDING = "savepoints-dispose-pending"  # dcc.Store: the location asked about
SP_DISPOSE_FEEDBACK = "savepoints-dispose-feedback"

# Operators (/jobs/{id}/operators): each operator's checkpoints over time
OT_METRICS_CHART = "operators-metrics-chart"
OT_HEAT_STRIP = "operators-heat-strip"
OT_COLOUR_BY = "operators-colour-by"  # radio: end-to-end or share of the checkpoint
OT_HOLDUPS = "operators-holdups"  # which operator was the last to acknowledge, how often
OT_MESSAGE = "operators-message"
