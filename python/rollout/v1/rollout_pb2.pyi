from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
JOB_MODE_EVAL: JobMode
JOB_MODE_RUN: JobMode
JOB_MODE_UNSPECIFIED: JobMode
JOB_STATE_CANCELLED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_UNSPECIFIED: JobState
TOKEN_LAYOUT_COMPACT: TokenLayout
TOKEN_LAYOUT_FULL: TokenLayout
TOKEN_LAYOUT_UNSPECIFIED: TokenLayout

class BeginPolicyUpdateRequest(_message.Message):
    __slots__ = ["job_id", "mode", "version"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    mode: str
    version: int
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., mode: _Optional[str] = ...) -> None: ...

class BeginPolicyUpdateResponse(_message.Message):
    __slots__ = ["current_version", "fallback", "in_flight", "pause_ms"]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MS_FIELD_NUMBER: _ClassVar[int]
    current_version: int
    fallback: bool
    in_flight: int
    pause_ms: int
    def __init__(self, fallback: bool = ..., in_flight: _Optional[int] = ..., pause_ms: _Optional[int] = ..., current_version: _Optional[int] = ...) -> None: ...

class BranchSummary(_message.Message):
    __slots__ = ["calls", "index", "parent", "shared_tokens", "split_call", "tokens", "trained_tokens"]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    SHARED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPLIT_CALL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRAINED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    calls: int
    index: int
    parent: int
    shared_tokens: int
    split_call: int
    tokens: int
    trained_tokens: int
    def __init__(self, index: _Optional[int] = ..., parent: _Optional[int] = ..., split_call: _Optional[int] = ..., shared_tokens: _Optional[int] = ..., tokens: _Optional[int] = ..., trained_tokens: _Optional[int] = ..., calls: _Optional[int] = ...) -> None: ...

class CallStatus(_message.Message):
    __slots__ = ["index", "name", "reason", "span_end", "span_start", "status", "turn"]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SPAN_END_FIELD_NUMBER: _ClassVar[int]
    SPAN_START_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    reason: str
    span_end: int
    span_start: int
    status: str
    turn: int
    def __init__(self, turn: _Optional[int] = ..., index: _Optional[int] = ..., name: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., span_start: _Optional[int] = ..., span_end: _Optional[int] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ["cancel_in_flight", "job_id"]
    CANCEL_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    cancel_in_flight: bool
    job_id: str
    def __init__(self, job_id: _Optional[str] = ..., cancel_in_flight: bool = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ["job"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ["summary"]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    summary: SessionSummary
    def __init__(self, summary: _Optional[_Union[SessionSummary, _Mapping]] = ...) -> None: ...

class CollectCredit(_message.Message):
    __slots__ = ["groups", "trainer_version"]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TRAINER_VERSION_FIELD_NUMBER: _ClassVar[int]
    groups: int
    trainer_version: int
    def __init__(self, groups: _Optional[int] = ..., trainer_version: _Optional[int] = ...) -> None: ...

class CollectGroupsRequest(_message.Message):
    __slots__ = ["credit", "items", "next", "start"]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    credit: CollectCredit
    items: CollectItems
    next: CollectNext
    start: CollectStart
    def __init__(self, start: _Optional[_Union[CollectStart, _Mapping]] = ..., credit: _Optional[_Union[CollectCredit, _Mapping]] = ..., items: _Optional[_Union[CollectItems, _Mapping]] = ..., next: _Optional[_Union[CollectNext, _Mapping]] = ...) -> None: ...

class CollectGroupsResponse(_message.Message):
    __slots__ = ["group", "status"]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    group: Group
    status: CollectStatus
    def __init__(self, group: _Optional[_Union[Group, _Mapping]] = ..., status: _Optional[_Union[CollectStatus, _Mapping]] = ...) -> None: ...

class CollectItems(_message.Message):
    __slots__ = ["items_json", "policy_version", "request_id", "sampling_json"]
    ITEMS_JSON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_JSON_FIELD_NUMBER: _ClassVar[int]
    items_json: _containers.RepeatedScalarFieldContainer[str]
    policy_version: int
    request_id: str
    sampling_json: str
    def __init__(self, request_id: _Optional[str] = ..., items_json: _Optional[_Iterable[str]] = ..., policy_version: _Optional[int] = ..., sampling_json: _Optional[str] = ...) -> None: ...

class CollectNext(_message.Message):
    __slots__ = ["count", "policy_version", "request_id", "sampling_json"]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_JSON_FIELD_NUMBER: _ClassVar[int]
    count: int
    policy_version: int
    request_id: str
    sampling_json: str
    def __init__(self, request_id: _Optional[str] = ..., count: _Optional[int] = ..., policy_version: _Optional[int] = ..., sampling_json: _Optional[str] = ...) -> None: ...

class CollectStart(_message.Message):
    __slots__ = ["config_yaml", "from_sequence", "initial_credits", "stream_id", "token_layout"]
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_CREDITS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    from_sequence: int
    initial_credits: int
    stream_id: str
    token_layout: TokenLayout
    def __init__(self, config_yaml: _Optional[str] = ..., initial_credits: _Optional[int] = ..., from_sequence: _Optional[int] = ..., stream_id: _Optional[str] = ..., token_layout: _Optional[_Union[TokenLayout, str]] = ...) -> None: ...

class CollectStatus(_message.Message):
    __slots__ = ["credits", "exhausted", "in_flight", "policy_version", "queued", "sent", "stale_dropped", "stale_marked", "stale_regenerated"]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    STALE_DROPPED_FIELD_NUMBER: _ClassVar[int]
    STALE_MARKED_FIELD_NUMBER: _ClassVar[int]
    STALE_REGENERATED_FIELD_NUMBER: _ClassVar[int]
    credits: int
    exhausted: bool
    in_flight: int
    policy_version: int
    queued: int
    sent: int
    stale_dropped: int
    stale_marked: int
    stale_regenerated: int
    def __init__(self, credits: _Optional[int] = ..., in_flight: _Optional[int] = ..., queued: _Optional[int] = ..., sent: _Optional[int] = ..., exhausted: bool = ..., policy_version: _Optional[int] = ..., stale_dropped: _Optional[int] = ..., stale_regenerated: _Optional[int] = ..., stale_marked: _Optional[int] = ...) -> None: ...

class DescribeEnvironmentRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DescribeEnvironmentResponse(_message.Message):
    __slots__ = ["config_schema_json", "default_config_yaml", "environment"]
    CONFIG_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    config_schema_json: str
    default_config_yaml: str
    environment: Environment
    def __init__(self, environment: _Optional[_Union[Environment, _Mapping]] = ..., config_schema_json: _Optional[str] = ..., default_config_yaml: _Optional[str] = ...) -> None: ...

class EndPolicyUpdateRequest(_message.Message):
    __slots__ = ["job_id", "version"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class EndPolicyUpdateResponse(_message.Message):
    __slots__ = ["resume_ms", "version"]
    RESUME_MS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    resume_ms: int
    version: int
    def __init__(self, version: _Optional[int] = ..., resume_ms: _Optional[int] = ...) -> None: ...

class Environment(_message.Message):
    __slots__ = ["description", "eval_only", "group_size", "image", "max_turns", "name", "splits", "toolsets"]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EVAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    TOOLSETS_FIELD_NUMBER: _ClassVar[int]
    description: str
    eval_only: bool
    group_size: int
    image: str
    max_turns: int
    name: str
    splits: _containers.RepeatedScalarFieldContainer[str]
    toolsets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., group_size: _Optional[int] = ..., max_turns: _Optional[int] = ..., toolsets: _Optional[_Iterable[str]] = ..., image: _Optional[str] = ..., eval_only: bool = ..., splits: _Optional[_Iterable[str]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ["job_id"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ["job"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetVersionResponse(_message.Message):
    __slots__ = ["commit", "docker_api_version", "go_version", "version"]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    DOCKER_API_VERSION_FIELD_NUMBER: _ClassVar[int]
    GO_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    commit: str
    docker_api_version: str
    go_version: str
    version: str
    def __init__(self, version: _Optional[str] = ..., commit: _Optional[str] = ..., go_version: _Optional[str] = ..., docker_api_version: _Optional[str] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ["category", "current_policy_version", "dropped", "env", "group_id", "item_id", "max_policy_version", "mean", "min_policy_version", "policy_lag", "policy_version", "regenerated", "request_id", "rollouts", "sequence", "stale", "std"]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    CURRENT_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REGENERATED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    category: str
    current_policy_version: int
    dropped: bool
    env: str
    group_id: str
    item_id: str
    max_policy_version: int
    mean: float
    min_policy_version: int
    policy_lag: int
    policy_version: int
    regenerated: int
    request_id: str
    rollouts: _containers.RepeatedCompositeFieldContainer[Rollout]
    sequence: int
    stale: bool
    std: float
    def __init__(self, group_id: _Optional[str] = ..., item_id: _Optional[str] = ..., env: _Optional[str] = ..., category: _Optional[str] = ..., dropped: bool = ..., mean: _Optional[float] = ..., std: _Optional[float] = ..., policy_version: _Optional[int] = ..., rollouts: _Optional[_Iterable[_Union[Rollout, _Mapping]]] = ..., request_id: _Optional[str] = ..., sequence: _Optional[int] = ..., min_policy_version: _Optional[int] = ..., max_policy_version: _Optional[int] = ..., current_policy_version: _Optional[int] = ..., policy_lag: _Optional[int] = ..., stale: bool = ..., regenerated: _Optional[int] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ["created_at", "env", "error", "finished_at", "id", "mode", "output_dir", "progress", "resumed", "state"]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIR_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    created_at: _timestamp_pb2.Timestamp
    env: str
    error: str
    finished_at: _timestamp_pb2.Timestamp
    id: str
    mode: JobMode
    output_dir: str
    progress: JobProgress
    resumed: int
    state: JobState
    def __init__(self, id: _Optional[str] = ..., mode: _Optional[_Union[JobMode, str]] = ..., state: _Optional[_Union[JobState, str]] = ..., env: _Optional[str] = ..., output_dir: _Optional[str] = ..., progress: _Optional[_Union[JobProgress, _Mapping]] = ..., error: _Optional[str] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., resumed: _Optional[int] = ...) -> None: ...

class JobProgress(_message.Message):
    __slots__ = ["groups_done", "groups_dropped", "groups_skipped", "groups_total", "infra_failed", "mean_reward", "rollouts", "rollouts_ok"]
    GROUPS_DONE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    INFRA_FAILED_FIELD_NUMBER: _ClassVar[int]
    MEAN_REWARD_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_OK_FIELD_NUMBER: _ClassVar[int]
    groups_done: int
    groups_dropped: int
    groups_skipped: int
    groups_total: int
    infra_failed: int
    mean_reward: float
    rollouts: int
    rollouts_ok: int
    def __init__(self, groups_total: _Optional[int] = ..., groups_done: _Optional[int] = ..., groups_skipped: _Optional[int] = ..., groups_dropped: _Optional[int] = ..., rollouts: _Optional[int] = ..., rollouts_ok: _Optional[int] = ..., infra_failed: _Optional[int] = ..., mean_reward: _Optional[float] = ...) -> None: ...

class ListEnvironmentsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListEnvironmentsResponse(_message.Message):
    __slots__ = ["environments"]
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[Environment]
    def __init__(self, environments: _Optional[_Iterable[_Union[Environment, _Mapping]]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ["jobs"]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ["group_id", "group_size", "item_id", "metadata"]
    class MetadataEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    group_size: int
    item_id: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, group_id: _Optional[str] = ..., item_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., group_size: _Optional[int] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ["anthropic_base_url", "api_key", "expires_after_idle_seconds", "group_id", "index", "openai_base_url", "session_id"]
    ANTHROPIC_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AFTER_IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OPENAI_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    anthropic_base_url: str
    api_key: str
    expires_after_idle_seconds: float
    group_id: str
    index: int
    openai_base_url: str
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., group_id: _Optional[str] = ..., index: _Optional[int] = ..., openai_base_url: _Optional[str] = ..., anthropic_base_url: _Optional[str] = ..., api_key: _Optional[str] = ..., expires_after_idle_seconds: _Optional[float] = ...) -> None: ...

class Rollout(_message.Message):
    __slots__ = ["advantage", "attempts", "branch", "branches", "call_statuses", "calls_json", "completion_tokens", "distill", "drift_tokens", "failure_kind", "failure_message", "finished_naturally", "index", "logprobs", "loss_mask", "loss_mask_runs", "messages_json", "parent_branch", "prompt_tokens", "reward", "reward_components", "rollout_id", "routed_experts", "routed_experts_shape", "session_id", "shared_tokens", "split_call", "status", "stop_reason", "token_versions", "tokens", "trained_logprobs", "turn_rewards", "turns", "unscored_tokens", "version_cuts"]
    class RewardComponentsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ADVANTAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    CALLS_JSON_FIELD_NUMBER: _ClassVar[int]
    CALL_STATUSES_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DISTILL_FIELD_NUMBER: _ClassVar[int]
    DRIFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_KIND_FIELD_NUMBER: _ClassVar[int]
    FAILURE_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_NATURALLY_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_RUNS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    PARENT_BRANCH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_SHAPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SHARED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPLIT_CALL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TRAINED_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TURN_REWARDS_FIELD_NUMBER: _ClassVar[int]
    UNSCORED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VERSION_CUTS_FIELD_NUMBER: _ClassVar[int]
    advantage: float
    attempts: int
    branch: int
    branches: _containers.RepeatedCompositeFieldContainer[Rollout]
    call_statuses: _containers.RepeatedCompositeFieldContainer[CallStatus]
    calls_json: str
    completion_tokens: int
    distill: _containers.RepeatedCompositeFieldContainer[TeacherTopK]
    drift_tokens: int
    failure_kind: str
    failure_message: str
    finished_naturally: bool
    index: int
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    loss_mask_runs: _containers.RepeatedScalarFieldContainer[int]
    messages_json: str
    parent_branch: int
    prompt_tokens: int
    reward: float
    reward_components: _containers.ScalarMap[str, float]
    rollout_id: str
    routed_experts: _containers.RepeatedScalarFieldContainer[int]
    routed_experts_shape: _containers.RepeatedScalarFieldContainer[int]
    session_id: str
    shared_tokens: int
    split_call: int
    status: str
    stop_reason: str
    token_versions: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    trained_logprobs: _containers.RepeatedScalarFieldContainer[float]
    turn_rewards: _containers.RepeatedScalarFieldContainer[float]
    turns: int
    unscored_tokens: int
    version_cuts: _containers.RepeatedCompositeFieldContainer[VersionCut]
    def __init__(self, index: _Optional[int] = ..., rollout_id: _Optional[str] = ..., status: _Optional[str] = ..., failure_kind: _Optional[str] = ..., failure_message: _Optional[str] = ..., reward: _Optional[float] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., advantage: _Optional[float] = ..., tokens: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., turns: _Optional[int] = ..., finished_naturally: bool = ..., stop_reason: _Optional[str] = ..., messages_json: _Optional[str] = ..., drift_tokens: _Optional[int] = ..., attempts: _Optional[int] = ..., token_versions: _Optional[_Iterable[int]] = ..., version_cuts: _Optional[_Iterable[_Union[VersionCut, _Mapping]]] = ..., loss_mask_runs: _Optional[_Iterable[int]] = ..., trained_logprobs: _Optional[_Iterable[float]] = ..., turn_rewards: _Optional[_Iterable[float]] = ..., distill: _Optional[_Iterable[_Union[TeacherTopK, _Mapping]]] = ..., unscored_tokens: _Optional[int] = ..., call_statuses: _Optional[_Iterable[_Union[CallStatus, _Mapping]]] = ..., routed_experts: _Optional[_Iterable[int]] = ..., routed_experts_shape: _Optional[_Iterable[int]] = ..., session_id: _Optional[str] = ..., branch: _Optional[int] = ..., parent_branch: _Optional[int] = ..., split_call: _Optional[int] = ..., shared_tokens: _Optional[int] = ..., calls_json: _Optional[str] = ..., branches: _Optional[_Iterable[_Union[Rollout, _Mapping]]] = ...) -> None: ...

class ScoreSessionRequest(_message.Message):
    __slots__ = ["branch_rewards", "metrics", "reward", "session_id"]
    class BranchRewardsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    BRANCH_REWARDS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    branch_rewards: _containers.ScalarMap[int, float]
    metrics: _containers.ScalarMap[str, float]
    reward: float
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., reward: _Optional[float] = ..., branch_rewards: _Optional[_Mapping[int, float]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ScoreSessionResponse(_message.Message):
    __slots__ = ["group_id", "pending"]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    pending: int
    def __init__(self, group_id: _Optional[str] = ..., pending: _Optional[int] = ...) -> None: ...

class SessionSummary(_message.Message):
    __slots__ = ["answered_calls", "branches", "calls", "completion_tokens", "drift_tokens", "failed_calls", "group_id", "index", "prompt_tokens", "reason", "rewritten", "session_id", "status", "unanchored"]
    ANSWERED_CALLS_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRIFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FAILED_CALLS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REWRITTEN_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UNANCHORED_FIELD_NUMBER: _ClassVar[int]
    answered_calls: int
    branches: _containers.RepeatedCompositeFieldContainer[BranchSummary]
    calls: int
    completion_tokens: int
    drift_tokens: int
    failed_calls: int
    group_id: str
    index: int
    prompt_tokens: int
    reason: str
    rewritten: int
    session_id: str
    status: str
    unanchored: int
    def __init__(self, session_id: _Optional[str] = ..., group_id: _Optional[str] = ..., index: _Optional[int] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., calls: _Optional[int] = ..., answered_calls: _Optional[int] = ..., failed_calls: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., rewritten: _Optional[int] = ..., unanchored: _Optional[int] = ..., drift_tokens: _Optional[int] = ..., branches: _Optional[_Iterable[_Union[BranchSummary, _Mapping]]] = ...) -> None: ...

class StartJobRequest(_message.Message):
    __slots__ = ["config_path", "config_yaml", "job_id", "mode"]
    CONFIG_PATH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    config_path: str
    config_yaml: str
    job_id: str
    mode: JobMode
    def __init__(self, config_yaml: _Optional[str] = ..., config_path: _Optional[str] = ..., job_id: _Optional[str] = ..., mode: _Optional[_Union[JobMode, str]] = ...) -> None: ...

class StartJobResponse(_message.Message):
    __slots__ = ["job"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class TeacherTopK(_message.Message):
    __slots__ = ["logprobs", "token_ids"]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class VersionCut(_message.Message):
    __slots__ = ["kind", "position", "to", "turn"]
    FROM_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    kind: str
    position: int
    to: int
    turn: int
    def __init__(self, turn: _Optional[int] = ..., position: _Optional[int] = ..., kind: _Optional[str] = ..., to: _Optional[int] = ..., **kwargs) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ["from_sequence", "include_groups", "job_id", "token_layout"]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    from_sequence: int
    include_groups: bool
    job_id: str
    token_layout: TokenLayout
    def __init__(self, job_id: _Optional[str] = ..., include_groups: bool = ..., from_sequence: _Optional[int] = ..., token_layout: _Optional[_Union[TokenLayout, str]] = ...) -> None: ...

class WatchJobResponse(_message.Message):
    __slots__ = ["finished", "group", "progress"]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    finished: Job
    group: Group
    progress: JobProgress
    def __init__(self, progress: _Optional[_Union[JobProgress, _Mapping]] = ..., group: _Optional[_Union[Group, _Mapping]] = ..., finished: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class WatchSessionGroupsRequest(_message.Message):
    __slots__ = ["from_sequence", "token_layout"]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    from_sequence: int
    token_layout: TokenLayout
    def __init__(self, token_layout: _Optional[_Union[TokenLayout, str]] = ..., from_sequence: _Optional[int] = ...) -> None: ...

class WatchSessionGroupsResponse(_message.Message):
    __slots__ = ["group"]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: Group
    def __init__(self, group: _Optional[_Union[Group, _Mapping]] = ...) -> None: ...

class JobMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class TokenLayout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
