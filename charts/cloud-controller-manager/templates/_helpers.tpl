{{/* The workload's name and its pods' app.kubernetes.io/name. */}}
{{- define "ccm.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object: the selector label, and Helm's own. */}}
{{- define "ccm.labels" -}}
app.kubernetes.io/name: {{ include "ccm.name" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The subjects every binding of the manager names: its service account and the static pod's user. */}}
{{- define "ccm.subjects" -}}
- kind: ServiceAccount
  name: {{ .Values.serviceAccountName }}
  namespace: {{ .Release.Namespace }}
{{- with .Values.rbac.staticPodUser }}
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {{ . }}
{{- end }}
{{- end -}}

{{/* The LeaderMigrationConfiguration's text. */}}
{{- define "ccm.migrationConfiguration" -}}
{{- .Values.leaderMigration.configuration | default (.Files.Get "files/leader-migration.yaml") -}}
{{- end -}}

{{/* The image reference: the digest wins over the tag. */}}
{{- define "ccm.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* Refusals of values that cannot work, before anything is rendered. */}}
{{- define "ccm.validate" -}}
{{- if and (hasKey .Values "namespace") (ne (toString .Values.namespace) .Release.Namespace) -}}
{{- fail (printf "namespace: %q differs from the release's namespace %q: install with -n %s instead (every object goes to the release's namespace)" (toString .Values.namespace) .Release.Namespace (toString .Values.namespace)) -}}
{{- end -}}
{{- if not (has .Values.kind (list "Deployment" "DaemonSet")) -}}
{{- fail (printf "kind: %q is not Deployment or DaemonSet" .Values.kind) -}}
{{- end -}}
{{- if not (has .Values.cloudConfig.kind (list "ConfigMap" "Secret")) -}}
{{- fail (printf "cloudConfig.kind: %q is not ConfigMap or Secret" .Values.cloudConfig.kind) -}}
{{- end -}}
{{- if and .Values.prometheusRule.enabled (ne (include "ccm.name" .) "cloud-controller-manager") -}}
{{- fail (printf "nameOverride: %q with prometheusRule.enabled: the shipped alerts watch job=\"cloud-controller-manager\", which the ServiceMonitor names after the workload" (include "ccm.name" .)) -}}
{{- end -}}
{{- $migration := fromYaml (include "ccm.migrationConfiguration" .) -}}
{{- if or (hasKey $migration "Error") (not $migration.leaderName) -}}
{{- fail "leaderMigration.configuration: not a LeaderMigrationConfiguration with a leaderName" -}}
{{- end -}}
{{- $provider := .Values.cloudProvider -}}
{{- range .Values.args -}}
{{- if hasPrefix "--cloud-provider=" (toString .) -}}{{- $provider = "set" -}}{{- end -}}
{{- end -}}
{{- if not $provider -}}
{{- fail "cloudProvider: empty, and no --cloud-provider in args: name the provider (aws, gce, fake, or your binary's)" -}}
{{- end -}}
{{- end -}}
