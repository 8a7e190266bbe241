{{/* Chart name. */}}
{{- define "lmcv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-chart unless the release already contains the chart name. */}}
{{- define "lmcv.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "lmcv.headless" -}}
{{- printf "%s-headless" (include "lmcv.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lmcv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lmcv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: valkey
{{- end -}}

{{- define "lmcv.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "lmcv.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: lmcache-valkey
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "lmcv.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lmcv.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Number of Valkey pods. */}}
{{- define "lmcv.replicas" -}}
{{- if eq .Values.valkey.mode "cluster" -}}
{{- mul .Values.valkey.cluster.shards (add 1 .Values.valkey.cluster.replicasPerShard) -}}
{{- else -}}
1
{{- end -}}
{{- end -}}

{{- define "lmcv.tierdImage" -}}
{{- printf "%s:%s" .Values.tierd.image.repository (default .Chart.AppVersion .Values.tierd.image.tag) -}}
{{- end -}}

{{- define "lmcv.moduleImage" -}}
{{- $img := .Values.valkey.module.initContainer.image -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}

{{/* valkey:// or valkeys:// */}}
{{- define "lmcv.scheme" -}}
{{- if .Values.tls.enabled -}}valkeys{{- else -}}valkey{{- end -}}
{{- end -}}

{{- define "lmcv.serviceHost" -}}
{{- printf "%s.%s.svc.%s" (include "lmcv.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* Client URL: the service (standalone) or every pod as a seed (cluster). */}}
{{- define "lmcv.clientUrl" -}}
{{- $scheme := include "lmcv.scheme" . -}}
{{- if eq .Values.valkey.mode "cluster" -}}
{{- $full := include "lmcv.fullname" . -}}
{{- $hl := include "lmcv.headless" . -}}
{{- $seeds := list -}}
{{- range $i := until (int .Values.valkey.cluster.shards) -}}
{{- $seeds = append $seeds (printf "%s-%d.%s.%s.svc.%s:%d" $full $i $hl $.Release.Namespace $.Values.clusterDomain (int $.Values.valkey.port)) -}}
{{- end -}}
{{- printf "%s://%s" $scheme (join "," $seeds) -}}
{{- else -}}
{{- printf "%s://%s:%d" $scheme (include "lmcv.serviceHost" .) (int .Values.valkey.port) -}}
{{- end -}}
{{- end -}}

{{/* Shared valkey-cli flags (TLS, --user); the password comes from REDISCLI_AUTH. */}}
{{- define "lmcv.cliFlags" -}}
{{- if .Values.tls.enabled }} --tls --cacert /etc/valkey/tls/{{ .Values.tls.caKey }}{{ if ne .Values.tls.authClients "no" }} --cert /etc/valkey/tls/{{ .Values.tls.certKey }} --key /etc/valkey/tls/{{ .Values.tls.keyKey }}{{ end }}{{ end }}{{ if .Values.auth.enabled }} --user {{ .Values.auth.serviceUser }}{{ end -}}
{{- end -}}

{{/* Environment for valkey-cli: the service user's password (valkey-cli reads REDISCLI_AUTH). */}}
{{- define "lmcv.cliAuthEnv" -}}
{{- if .Values.auth.enabled -}}
- name: REDISCLI_AUTH
  valueFrom:
    secretKeyRef:
      name: {{ .Values.auth.existingSecret }}
      key: {{ .Values.auth.servicePasswordKey }}
{{- end }}
{{- end -}}
