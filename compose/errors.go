// Package compose holds what the whole Compose tree shares: the coded error
// type users see and the stable codes of spec §5.11.
package compose

import (
	"errors"

	"github.com/iii-sandbox/iii/protocol"
)

// Error is a Compose failure a user sees. Code is stable (scripts and tests
// match on it); Message says what is wrong, where, and what to write instead.
type Error struct {
	Code    string
	Message string
}

// Error makes *Error a Go error; the code comes first so logs stay greppable.
func (e *Error) Error() string { return e.Code + ": " + e.Message }

// ErrorBody converts the error to the shape compose::* functions return over
// the wire.
func (e *Error) ErrorBody() *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: e.Code, Message: e.Message}
}

// Is matches another *Error by code only, so errors.Is(err, &Error{Code: X})
// works regardless of the message.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) || t == nil {
		return false
	}
	return t.Code == e.Code
}

// New returns an *Error with the given code and message.
func New(code, message string) *Error { return &Error{Code: code, Message: message} }

// CodeOf returns the code of the first *Error in err's chain, or "" when
// there is none.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Compose file.
const (
	CodeComposeFileUnreadable   = "COMPOSE_FILE_UNREADABLE"
	CodeInvalidComposeFile      = "INVALID_COMPOSE_FILE"
	CodeEmptyContainers         = "EMPTY_CONTAINERS"
	CodeInvalidDuration         = "INVALID_DURATION"
	CodeUnknownDependency       = "UNKNOWN_DEPENDENCY"
	CodeSelfDependency          = "SELF_DEPENDENCY"
	CodeDependencyCycle         = "DEPENDENCY_CYCLE"
	CodeUnsupportedWorkerSource = "UNSUPPORTED_WORKER_SOURCE"
	CodeUndefinedVariable       = "UNDEFINED_VARIABLE"
	CodeInvalidReference        = "INVALID_REFERENCE"
	CodeUnterminatedReference   = "UNTERMINATED_REFERENCE"
)

// Lock.
const (
	CodeInvalidComposeLock   = "INVALID_COMPOSE_LOCK"
	CodeComposeLockRequired  = "COMPOSE_LOCK_REQUIRED"
	CodeComposeLockOutOfDate = "COMPOSE_LOCK_OUT_OF_DATE"
)

// Worker declaration.
const (
	CodeMissingVersionForPackage      = "MISSING_VERSION_FOR_PACKAGE"
	CodeRuntimeOnlyForBundles         = "RUNTIME_ONLY_FOR_BUNDLES"
	CodePackageRunRequiresHostRuntime = "PACKAGE_RUN_REQUIRES_HOST_RUNTIME"
	CodeRuntimeRequiresBundle         = "RUNTIME_REQUIRES_BUNDLE"
	CodeInvalidHostBundleContainerKey = "INVALID_HOST_BUNDLE_CONTAINER_KEY"
	CodeNotAPackageContainer          = "NOT_A_PACKAGE_CONTAINER"
	CodePreRunTimeoutWithoutPreRun    = "PRE_RUN_TIMEOUT_WITHOUT_PRE_RUN"
	CodeReservedEnvOverride           = "RESERVED_ENV_OVERRIDE"
	CodeMissingEnvFile                = "MISSING_ENV_FILE"
	// CodeRunNotAllowedForPackage is the 0.23 name of
	// CodePackageRunRequiresHostRuntime; kept so old scripts still match.
	CodeRunNotAllowedForPackage = "RUN_NOT_ALLOWED_FOR_PACKAGE"
)

// Worker resolution.
const (
	CodeMissingWorkerDirectory = "MISSING_WORKER_DIRECTORY"
	CodeMissingStartCommand    = "MISSING_START_COMMAND"
	CodeInvalidManifest        = "INVALID_MANIFEST"
	CodeInvalidWorkerSpec      = "INVALID_WORKER_SPEC"
	CodeWorkerSourceChanged    = "WORKER_SOURCE_CHANGED"
	CodeEngineWorkerIsBuiltin  = "ENGINE_WORKER_IS_BUILTIN"
)

// Packages.
const (
	CodeRegistryUnreachable    = "REGISTRY_UNREACHABLE"
	CodePackageNotResolved     = "PACKAGE_NOT_RESOLVED"
	CodePackageNotInstalled    = "PACKAGE_NOT_INSTALLED"
	CodePackageDownloadFailed  = "PACKAGE_DOWNLOAD_FAILED"
	CodePackageDigestMismatch  = "PACKAGE_DIGEST_MISMATCH"
	CodePackageArtifactEmpty   = "PACKAGE_ARTIFACT_EMPTY"
	CodeRegistryNameRefused    = "REGISTRY_NAME_REFUSED"
	CodeUnsupportedPackageKind = "UNSUPPORTED_PACKAGE_KIND"
	CodeUnsupportedPlatform    = "UNSUPPORTED_PLATFORM"
	CodeBundleNeedsAVM         = "BUNDLE_NEEDS_A_VM"
)

// Start and readiness.
const (
	CodeSpawnFailed                   = "SPAWN_FAILED"
	CodeHookSpawnFailed               = "HOOK_SPAWN_FAILED"
	CodeHookFailed                    = "HOOK_FAILED"
	CodeHookTimeout                   = "HOOK_TIMEOUT"
	CodeStartupTimeout                = "STARTUP_TIMEOUT"
	CodeChildExitedBeforeRegistration = "CHILD_EXITED_BEFORE_REGISTRATION"
	CodeWorkerIgnoredNamespace        = "WORKER_IGNORED_NAMESPACE"
	CodeWorkerNameMismatch            = "WORKER_NAME_MISMATCH"
	CodeFunctionsInWrongNamespace     = "FUNCTIONS_IN_WRONG_NAMESPACE"
	CodeContainerNameTaken            = "CONTAINER_NAME_TAKEN"
	CodeConfigFetchFailed             = "CONFIG_FETCH_FAILED"
	CodeConfigPublishFailed           = "CONFIG_PUBLISH_FAILED"
	CodeEngineCallFailed              = "ENGINE_CALL_FAILED"
	CodeProjectDidNotStart            = "PROJECT_DID_NOT_START"
)

// Managed engine.
const (
	CodeEngineSectionRequiresManagedStart = "ENGINE_SECTION_REQUIRES_MANAGED_START"
	CodeEngineAlreadyOwned                = "ENGINE_ALREADY_OWNED"
	CodeEngineRestartRequired             = "ENGINE_RESTART_REQUIRED"
	CodeEngineWorkerIsInjected            = "ENGINE_WORKER_IS_INJECTED"
	CodeUnsupportedEngineWorker           = "UNSUPPORTED_ENGINE_WORKER"
	CodeInvalidEngineWorkerConfig         = "INVALID_ENGINE_WORKER_CONFIG"
	CodeInvalidManagedEngineURL           = "INVALID_MANAGED_ENGINE_URL"
	CodeManagedEngineEndpointMismatch     = "MANAGED_ENGINE_ENDPOINT_MISMATCH"
	CodeManagedEngineListenerUnavailable  = "MANAGED_ENGINE_LISTENER_UNAVAILABLE"
	CodeEngineSpawnFailed                 = "ENGINE_SPAWN_FAILED"
	CodeEngineStartupTimeout              = "ENGINE_STARTUP_TIMEOUT"
	CodeEngineExited                      = "ENGINE_EXITED"
)

// Sandbox (0.26).
const (
	CodeSandboxConfigMoved        = "SANDBOX_CONFIG_MOVED"
	CodeSandboxAdapterNotDeclared = "SANDBOX_ADAPTER_NOT_DECLARED"
)

// Daemon and project.
const (
	CodeNoComposeFile        = "NO_COMPOSE_FILE"
	CodeWrongDaemon          = "WRONG_DAEMON"
	CodeInvalidNamespace     = "INVALID_NAMESPACE"
	CodeUnknownContainer     = "UNKNOWN_CONTAINER"
	CodeUnknownProject       = "UNKNOWN_PROJECT"
	CodeInvalidStateFile     = "INVALID_STATE_FILE"
	CodeStateDirUnavailable  = "STATE_DIR_UNAVAILABLE"
	CodeDaemonAlreadyServing = "DAEMON_ALREADY_SERVING"
	CodeDaemonNamespaceTaken = "DAEMON_NAMESPACE_TAKEN"
	CodeIOError              = "IO_ERROR"
)

// Command line.
const (
	CodeFileRequiresUp                 = "FILE_REQUIRES_UP"
	CodeBuildConflictsWithServeOptions = "BUILD_CONFLICTS_WITH_SERVE_OPTIONS"
)

// Codes lists every code above, in spec order; docs and tests iterate it so a
// new code cannot be forgotten in either.
func Codes() []string {
	return []string{
		CodeComposeFileUnreadable, CodeInvalidComposeFile, CodeEmptyContainers, CodeInvalidDuration,
		CodeUnknownDependency, CodeSelfDependency, CodeDependencyCycle, CodeUnsupportedWorkerSource,
		CodeUndefinedVariable, CodeInvalidReference, CodeUnterminatedReference,
		CodeInvalidComposeLock, CodeComposeLockRequired, CodeComposeLockOutOfDate,
		CodeMissingVersionForPackage, CodeRuntimeOnlyForBundles, CodePackageRunRequiresHostRuntime,
		CodeRuntimeRequiresBundle, CodeInvalidHostBundleContainerKey, CodeNotAPackageContainer,
		CodePreRunTimeoutWithoutPreRun, CodeReservedEnvOverride, CodeMissingEnvFile, CodeRunNotAllowedForPackage,
		CodeMissingWorkerDirectory, CodeMissingStartCommand, CodeInvalidManifest, CodeInvalidWorkerSpec,
		CodeWorkerSourceChanged, CodeEngineWorkerIsBuiltin,
		CodeRegistryUnreachable, CodePackageNotResolved, CodePackageNotInstalled, CodePackageDownloadFailed,
		CodePackageDigestMismatch, CodePackageArtifactEmpty, CodeRegistryNameRefused, CodeUnsupportedPackageKind,
		CodeUnsupportedPlatform, CodeBundleNeedsAVM,
		CodeSpawnFailed, CodeHookSpawnFailed, CodeHookFailed, CodeHookTimeout, CodeStartupTimeout,
		CodeChildExitedBeforeRegistration, CodeWorkerIgnoredNamespace, CodeWorkerNameMismatch,
		CodeFunctionsInWrongNamespace, CodeContainerNameTaken, CodeConfigFetchFailed, CodeConfigPublishFailed,
		CodeEngineCallFailed, CodeProjectDidNotStart,
		CodeEngineSectionRequiresManagedStart, CodeEngineAlreadyOwned, CodeEngineRestartRequired,
		CodeEngineWorkerIsInjected, CodeUnsupportedEngineWorker, CodeInvalidEngineWorkerConfig,
		CodeInvalidManagedEngineURL, CodeManagedEngineEndpointMismatch, CodeManagedEngineListenerUnavailable,
		CodeEngineSpawnFailed, CodeEngineStartupTimeout, CodeEngineExited,
		CodeSandboxConfigMoved, CodeSandboxAdapterNotDeclared,
		CodeNoComposeFile, CodeWrongDaemon, CodeInvalidNamespace, CodeUnknownContainer, CodeUnknownProject,
		CodeInvalidStateFile, CodeStateDirUnavailable, CodeDaemonAlreadyServing, CodeDaemonNamespaceTaken,
		CodeIOError,
		CodeFileRequiresUp, CodeBuildConflictsWithServeOptions,
	}
}
