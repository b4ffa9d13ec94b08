{{/* Chart name, truncated to a DNS label. */}}
{{- define "ebplus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's resources. Kept to 40 characters: KubeRay derives the RayCluster,
pod and Service names from the RayService name and appends suffixes.
*/}}
{{- define "ebplus.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ebplus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: the release's Ray pods (head and workers). */}}
{{- define "ebplus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ebplus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Common labels. */}}
{{- define "ebplus.labels" -}}
helm.sh/chart: {{ include "ebplus.chart" . }}
{{ include "ebplus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ebplus
{{- end }}

{{- define "ebplus.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Name of the Secret with the admin token (and API key). */}}
{{- define "ebplus.secretName" -}}
{{- default (printf "%s-auth" (include "ebplus.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* Name of the Serve Service (OpenAI API, /health, /admin, /metrics). */}}
{{- define "ebplus.serveServiceName" -}}
{{- printf "%s-serve" (include "ebplus.fullname" .) }}
{{- end }}

{{/* HTTP port of Serve, from the EB+ config (ServeConfig.http.port, default 8000). */}}
{{- define "ebplus.httpPort" -}}
{{- $http := .Values.config.http | default dict }}
{{- $http.port | default 8000 | int }}
{{- end }}

{{/* Ray's metrics export port, from the EB+ config (ServeConfig.ray.metrics_export_port, default 8080). */}}
{{- define "ebplus.metricsPort" -}}
{{- $ray := .Values.config.ray | default dict }}
{{- $ray.metrics_export_port | default 8080 | int }}
{{- end }}

{{/*
"true" when the Prometheus Operator objects may be rendered: monitoring is on and the cluster
serves the monitoring.coreos.com/v1 API (its CRDs are installed). Without the CRDs an install
would fail on the first ServiceMonitor; `helm template` needs `--api-versions monitoring.coreos.com/v1`.
*/}}
{{- define "ebplus.monitoringApi" -}}
{{- if and .Values.monitoring.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/*
Container env of every Ray pod: the credentials, from the Secret only (never in clear).
Ray workers inherit the raylet's environment, so the Serve replicas see them on any node.
*/}}
{{- define "ebplus.authEnv" -}}
{{- $auth := .Values.config.auth | default dict -}}
- name: {{ $auth.admin_token_env | default "EBPLUS_ADMIN_TOKEN" }}
  valueFrom:
    secretKeyRef:
      name: {{ include "ebplus.secretName" . }}
      key: {{ .Values.auth.adminTokenKey }}
{{- if .Values.auth.apiKey.enabled }}
- name: {{ $auth.api_key_env | default "EBPLUS_API_KEY" }}
  valueFrom:
    secretKeyRef:
      name: {{ include "ebplus.secretName" . }}
      key: {{ .Values.auth.apiKey.key }}
{{- end }}
{{- end }}

{{/* Name and key of the Secret with the Hugging Face token; empty name: no token configured. */}}
{{- define "ebplus.hfSecretName" -}}
{{- if .Values.hf.existingSecret }}{{ .Values.hf.existingSecret }}{{ else if .Values.hf.token }}{{ include "ebplus.fullname" . }}-hf{{ end }}
{{- end }}
{{- define "ebplus.hfSecretKey" -}}
{{- if .Values.hf.existingSecret }}{{ .Values.hf.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{/*
Env of every Ray container (head and each worker group; KubeRay copies it to the workers'
wait-gcs-ready init container): the credentials and the Hub token from their Secrets, HF_HOME
on the model cache, the read deadline of Ray Serve's HTTP servers (Ray's hook into the processes
that serve HTTP, and config.http.read_deadline_s when set: ebplus.deploy.read_deadline), and, with
servingPlane.tuned, Ray Serve's settings from files/serve-env.yaml
(generated from ebplus.deploy.serve_env.SERVE_ENV, the list `ebplus serve` uses). The group's own
env entries (head.env, workerGroups[].env) win: a variable they name is not rendered twice.
Call with (dict "root" $ "group" <head or group values>).
*/}}
{{- define "ebplus.rayEnv" -}}
{{- $root := .root }}
{{- $user := .group.env | default list }}
{{- $taken := dict }}
{{- range $user }}{{ $_ := set $taken .name true }}{{ end }}
{{- $env := include "ebplus.authEnv" $root | fromYamlArray }}
{{- with include "ebplus.hfSecretName" $root }}
{{- $env = append $env (dict "name" "HF_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" . "key" (include "ebplus.hfSecretKey" $root)))) }}
{{- end }}
{{- $env = append $env (dict "name" "HF_HOME" "value" $root.Values.hf.cache.mountPath) }}
{{- $env = append $env (dict "name" "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH" "value" "ebplus.deploy.read_deadline:ray_http_callback") }}
{{- with ((($root.Values.config).http).read_deadline_s) }}
{{- $env = append $env (dict "name" "EBPLUS_HTTP_READ_DEADLINE_S" "value" (toString .)) }}
{{- end }}
{{- if $root.Values.servingPlane.tuned }}
{{- range $name, $value := $root.Files.Get "files/serve-env.yaml" | fromYaml }}
{{- $env = append $env (dict "name" $name "value" (toString $value)) }}
{{- end }}
{{- end }}
{{- $out := list }}
{{- range $env }}{{ if not (hasKey $taken .name) }}{{ $out = append $out . }}{{ end }}{{ end }}
{{- toYaml (concat $out $user) }}
{{- end }}

{{/*
Mounts of the writable paths (the root filesystem is read-only): one emptyDir per
writablePaths entry, named by its index (a path is no DNS label).
*/}}
{{- define "ebplus.writableMounts" -}}
{{- range $i, $path := .Values.writablePaths }}
- name: writable-{{ $i }}
  mountPath: {{ $path }}
{{- end }}
{{- end }}

{{/* Volume mounts every Ray container gets (writable paths first: the cache mounts inside ~/.cache). */}}
{{- define "ebplus.volumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
{{- include "ebplus.writableMounts" .root }}
- name: hf-cache
  mountPath: {{ .root.Values.hf.cache.mountPath }}
{{- if .root.Values.modelStorage.enabled }}
- name: models
  mountPath: {{ .root.Values.modelStorage.mountPath }}
  readOnly: {{ .root.Values.modelStorage.readOnly }}
{{- end }}
{{- if and .head .root.Values.controllerState.enabled }}
- name: controller-state
  mountPath: {{ .root.Values.controllerState.mountPath }}
{{- end }}
{{- with .group.volumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volumes every Ray pod gets. */}}
{{- define "ebplus.volumes" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .group.shmSize | default "8Gi" }}
{{- range $i, $_ := .root.Values.writablePaths }}
- name: writable-{{ $i }}
  emptyDir: {}
{{- end }}
- name: hf-cache
{{- with .root.Values.hf.cache }}
{{- if .existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .existingClaim }}
{{- else }}
  emptyDir:
    sizeLimit: {{ .sizeLimit }}
{{- end }}
{{- end }}
{{- if .root.Values.modelStorage.enabled }}
- name: models
  persistentVolumeClaim:
    claimName: {{ .root.Values.modelStorage.existingClaim }}
    readOnly: {{ .root.Values.modelStorage.readOnly }}
{{- end }}
{{- if and .head .root.Values.controllerState.enabled }}
- name: controller-state
  persistentVolumeClaim:
    claimName: {{ include "ebplus.controllerStateClaim" .root }}
{{- end }}
{{- with .group.volumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The controller state claim: the given one, else the one the chart creates. */}}
{{- define "ebplus.controllerStateClaim" -}}
{{- .Values.controllerState.existingClaim | default (printf "%s-controller-state" (include "ebplus.fullname" .)) }}
{{- end }}

{{/*
The Serve application's args: the `config` values verbatim, except that with controllerState
the controller's state_dir points at the head's state volume (unless config sets it). The
controller actor runs on the head (controller.placement 'head', the default), where it is mounted.
*/}}
{{- define "ebplus.appArgs" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- if .Values.controllerState.enabled }}
{{- $controller := $config.controller | default dict }}
{{- if not $controller.state_dir }}
{{- $_ := set $controller "state_dir" .Values.controllerState.mountPath }}
{{- $_ := set $config "controller" $controller }}
{{- end }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
Cross-field checks the JSON schema cannot express; each fails with one readable line.
(ServeConfig's own cross-checks, e.g. scheduler.k <= n, run when the app starts.)

GPUs per replica: Ray Serve LLM reserves tensor_parallel_size x pipeline_parallel_size GPUs
for each replica (a placement group of that many {"GPU": 1} bundles, from engine_kwargs,
i.e. config.engine.extra). A tensor-parallel group must sit inside one pod (its GPUs talk
over NVLink/PCIe), so each group's `gpus` must be a multiple of tensor_parallel_size;
pipeline stages may span pods.
*/}}
{{- define "ebplus.validate" -}}
{{- $extra := (.Values.config.engine | default dict).extra | default dict }}
{{- $tp := $extra.tensor_parallel_size | default 1 | int }}
{{- $pp := $extra.pipeline_parallel_size | default 1 | int }}
{{- $replicas := .Values.config.replicas | default dict }}
{{- $onGpu := eq ($replicas.accelerator | default "gpu") "gpu" }}
{{- $gpus := 0 }}
{{- $tpGroups := 0 }}
{{- $names := dict }}
{{- range $i, $g := .Values.workerGroups }}
{{- if hasKey $names $g.name }}
{{- fail (printf "workerGroups: the group name %q is used twice" $g.name) }}
{{- end }}
{{- $_ := set $names $g.name true }}
{{- $perPod := ternary $g.gpus 1 (hasKey $g "gpus") | int }}
{{- $pods := ternary $g.replicas 1 (hasKey $g "replicas") | int }}
{{- if and $onGpu (gt $perPod 0) (ne (mod $perPod $tp) 0) }}
{{- fail (printf "workerGroups.%d.gpus (%d) must be a multiple of config.engine.extra.tensor_parallel_size (%d): a tensor-parallel replica needs its GPUs in one pod" $i $perPod $tp) }}
{{- end }}
{{- $gpus = add $gpus (mul $pods $perPod) }}
{{- $tpGroups = add $tpGroups (mul $pods (div $perPod $tp)) }}
{{- end }}
{{- $num := $replicas.num_replicas | default 1 | int }}
{{- if and $onGpu (gt (mul $num $pp) (int $tpGroups)) }}
{{- fail (printf "config.replicas.num_replicas (%d) needs %d GPUs (%d per replica = tensor_parallel_size %d x pipeline_parallel_size %d) but the workerGroups have %d (sum of replicas x gpus)" $num (mul $num $tp $pp) (mul $tp $pp) $tp $pp (int $gpus)) }}
{{- end }}
{{- if and .Values.modelStorage.enabled (not .Values.modelStorage.existingClaim) }}
{{- fail "modelStorage.existingClaim is required when modelStorage.enabled is true" }}
{{- end }}
{{- /* A local directory must be on a volume: the image holds no models (ebplus.deploy.sources' local forms). */}}
{{- $model := .Values.config.model | default dict }}
{{- $source := $model.source | default "" | toString }}
{{- if and (not .Values.modelStorage.enabled) (or (hasPrefix "/" $source) (hasPrefix "." $source) (hasPrefix "~" $source)) }}
{{- fail (printf "config.model.source is a local path (%s) but nothing mounts it: set modelStorage.enabled=true and modelStorage.existingClaim, or use a Hugging Face Hub id such as Qwen/Qwen3-8B" $source) }}
{{- end }}
{{- /* A builtin model is built into cache_dir, which must be writable with a read-only root filesystem. */}}
{{- if and (hasPrefix "builtin:" $source) (.Values.securityContext | default dict).readOnlyRootFilesystem }}
{{- $cacheDir := $model.cache_dir | default "models" | toString }}
{{- $writable := false }}
{{- range (concat .Values.writablePaths (list .Values.hf.cache.mountPath)) }}
{{- if or (eq $cacheDir .) (hasPrefix (printf "%s/" (trimSuffix "/" .)) $cacheDir) }}{{ $writable = true }}{{ end }}
{{- end }}
{{- if not $writable }}
{{- fail (printf "config.model.cache_dir (%s) is not writable (the root filesystem is read-only): put it under one of writablePaths, e.g. /home/ray/.cache/ebplus-models" $cacheDir) }}
{{- end }}
{{- end }}
{{- if and .Values.rayAuth.enabled (semverCompare "<2.52.0-0" .Values.rayService.rayVersion) }}
{{- fail (printf "rayAuth.enabled needs Ray >= 2.52.0 (KubeRay refuses token auth below it), rayService.rayVersion is %s: raise it or set rayAuth.enabled=false" .Values.rayService.rayVersion) }}
{{- end }}
{{- if and .Values.gcsFaultTolerance.enabled (not .Values.gcsFaultTolerance.redisAddress) }}
{{- fail "gcsFaultTolerance.redisAddress is required when gcsFaultTolerance.enabled is true" }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.hosts is empty: name at least one host when ingress.enabled is true" }}
{{- end }}
{{- end }}
