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

{{/* Volume mounts every Ray container gets. */}}
{{- define "ebplus.volumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
{{- if .root.Values.modelStorage.enabled }}
- name: models
  mountPath: {{ .root.Values.modelStorage.mountPath }}
  readOnly: {{ .root.Values.modelStorage.readOnly }}
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
{{- if .root.Values.modelStorage.enabled }}
- name: models
  persistentVolumeClaim:
    claimName: {{ .root.Values.modelStorage.existingClaim }}
    readOnly: {{ .root.Values.modelStorage.readOnly }}
{{- end }}
{{- with .group.volumes }}
{{ toYaml . }}
{{- end }}
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
{{- end }}
