{{/* Chart name, truncated to the 63 characters Kubernetes allows in names. */}}
{{- define "loopwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already contains the chart name. */}}
{{- define "loopwarden.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "loopwarden.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "loopwarden.labels" -}}
helm.sh/chart: {{ include "loopwarden.chart" . }}
{{ include "loopwarden.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "loopwarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loopwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "loopwarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "loopwarden.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "loopwarden.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Where the TLS secret is mounted. */}}
{{- define "loopwarden.tlsDir" -}}/etc/loopwarden/kafka-tls{{- end }}

{{/*
loopwarden.toml: .Values.config plus what the chart owns (state path, HTTP listener,
brokers, TLS/SASL client properties, spans to Kafka). SASL credentials are not here:
they come from the secret as environment variables.
*/}}
{{- define "loopwarden.config" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- $state := get $config "state" | default dict }}
{{- $_ := set $state "path" "/var/lib/loopwarden/state" }}
{{- $_ := set $config "state" $state }}
{{- $telemetry := get $config "telemetry" | default dict }}
{{- $_ := set $telemetry "http_listen" (printf "0.0.0.0:%d" (int .Values.metricsPort)) }}
{{- if .Values.otel.spansToKafka }}
{{- $_ := set $telemetry "spans_to_kafka" true }}
{{- end }}
{{- $_ := set $config "telemetry" $telemetry }}
{{- $kafka := get $config "kafka" | default dict }}
{{- $_ := set $kafka "brokers" .Values.kafka.brokers }}
{{- $client := get $kafka "client" | default dict }}
{{- $tls := .Values.kafka.tls }}
{{- $sasl := .Values.kafka.sasl }}
{{- if and $tls.enabled $sasl.enabled }}
{{- $_ := set $client "security.protocol" "SASL_SSL" }}
{{- else if $tls.enabled }}
{{- $_ := set $client "security.protocol" "SSL" }}
{{- else if $sasl.enabled }}
{{- $_ := set $client "security.protocol" "SASL_PLAINTEXT" }}
{{- end }}
{{- if and $tls.enabled $tls.existingSecret }}
{{- $_ := set $client "ssl.ca.location" (printf "%s/%s" (include "loopwarden.tlsDir" .) $tls.caKey) }}
{{- if $tls.clientAuth }}
{{- $_ := set $client "ssl.certificate.location" (printf "%s/%s" (include "loopwarden.tlsDir" .) $tls.certKey) }}
{{- $_ := set $client "ssl.key.location" (printf "%s/%s" (include "loopwarden.tlsDir" .) $tls.keyKey) }}
{{- end }}
{{- end }}
{{- if $sasl.enabled }}
{{- $_ := set $client "sasl.mechanisms" $sasl.mechanism }}
{{- end }}
{{- if $client }}
{{- $_ := set $kafka "client" $client }}
{{- end }}
{{- $_ := set $config "kafka" $kafka }}
{{- toToml $config }}
{{- end }}
