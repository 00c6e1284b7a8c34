{{/*
Names. The chart name, full name, labels and selector match NVIDIA's chart, so a release moved
from that chart keeps its DaemonSet (whose selector cannot change) across `helm upgrade`.
*/}}
{{- define "nvidia-device-plugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nvidia-device-plugin.fullname" -}}
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

{{- define "nvidia-device-plugin.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "nvidia-device-plugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of the pods; the selector unless selectorLabelsOverride replaces it. */}}
{{- define "nvidia-device-plugin.templateLabels" -}}
app.kubernetes.io/name: {{ include "nvidia-device-plugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- with .Values.selectorLabelsOverride }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "nvidia-device-plugin.selectorLabels" -}}
{{- if .Values.selectorLabelsOverride }}
{{- toYaml .Values.selectorLabelsOverride }}
{{- else }}
{{- include "nvidia-device-plugin.templateLabels" . }}
{{- end }}
{{- end }}

{{/*
The selector and pod labels of NVIDIA's three DaemonSets (device plugin, GPU feature discovery, MPS
control daemon); call with (dict "root" $ "component" NAME), NAME being device-plugin,
gpu-feature-discovery or mps-control-daemon. As in NVIDIA's chart, all three select by the same labels
(unless componentSelectorLabels.enabled), so that `helm upgrade` of a release of NVIDIA's chart keeps
their selectors, which cannot change. The pods always carry the component label too: the Service and
the PodMonitor select the device plugin's pods by it.
*/}}
{{- define "nvidia-device-plugin.daemonSetSelector" -}}
{{ include "nvidia-device-plugin.selectorLabels" .root }}
{{- with include "nvidia-device-plugin.componentLabel" . | trim }}
{{ . }}
{{- end }}
{{- end }}

{{- define "nvidia-device-plugin.podLabels" -}}
{{ include "nvidia-device-plugin.templateLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* What the Service and the PodMonitor select: the device plugin's pods. */}}
{{- define "nvidia-device-plugin.pluginPodSelector" -}}
{{ include "nvidia-device-plugin.selectorLabels" . }}
app.kubernetes.io/component: device-plugin
{{- end }}

{{/* "true" unless devicePlugin.enabled is false (NVIDIA's key: GFD alone, or DRA alone). */}}
{{- define "nvidia-device-plugin.devicePluginEnabled" -}}
{{- $enabled := (.Values.devicePlugin | default dict).enabled }}
{{- kindIs "bool" $enabled | ternary $enabled true }}
{{- end }}

{{- define "nvidia-device-plugin.labels" -}}
helm.sh/chart: {{ include "nvidia-device-plugin.chart" . }}
{{ include "nvidia-device-plugin.templateLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nvidia-device-plugin.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{- define "nvidia-device-plugin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-service-account" (include "nvidia-device-plugin.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Config file. "configMapName" is the ConfigMap holding the config entries ("" for none);
"configEntry" is the one entry every node uses, chosen from config.default, else from
config.fallbackStrategies; "" means no config file (the "empty" fallback, or no config at all).
An entry that cannot be chosen fails the render with the reason.
*/}}
{{- define "nvidia-device-plugin.configMapName" -}}
{{- if .Values.config.name }}
{{- .Values.config.name }}
{{- else if .Values.config.map }}
{{- printf "%s-configs" (include "nvidia-device-plugin.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "nvidia-device-plugin.configEntry" -}}
{{- $config := .Values.config }}
{{- $known := list "named" "single" "empty" }}
{{- range $config.fallbackStrategies }}
{{- if not (has . $known) }}
{{- fail (printf "config.fallbackStrategies: unknown strategy %q (accepted: named, single, empty)" .) }}
{{- end }}
{{- end }}
{{- $entry := "" }}
{{- if and $config.name $config.map }}
{{- fail "config: set either config.name (an existing ConfigMap) or config.map (entries for a ConfigMap made by this chart), not both" }}
{{- else if $config.map }}
{{- if $config.default }}
{{- if not (hasKey $config.map $config.default) }}
{{- fail (printf "config.default: %q is not an entry of config.map (entries: %s)" $config.default (keys $config.map | sortAlpha | join ", ")) }}
{{- end }}
{{- $entry = $config.default }}
{{- else }}
{{- $decided := false }}
{{- range $config.fallbackStrategies }}
{{- if not $decided }}
{{- if and (eq . "named") (hasKey $config.map "default") }}
{{- $entry = "default" }}
{{- $decided = true }}
{{- else if and (eq . "single") (eq (len $config.map) 1) }}
{{- $entry = keys $config.map | first }}
{{- $decided = true }}
{{- else if eq . "empty" }}
{{- $decided = true }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $decided }}
{{- fail (printf "config: config.map has entries %s but none is chosen: set config.default, or name an entry \"default\" (fallback \"named\"), or keep a single entry (fallback \"single\"), or add the \"empty\" fallback; config.fallbackStrategies is %v" (keys $config.map | sortAlpha | join ", ") $config.fallbackStrategies) }}
{{- end }}
{{- end }}
{{- else if $config.name }}
{{- if $config.default }}
{{- $entry = $config.default }}
{{- else if has "named" $config.fallbackStrategies }}
{{- $entry = "default" }}
{{- else }}
{{- fail (printf "config.default: required with config.name %q: the chart cannot see the entries of an existing ConfigMap, so it needs the entry's name (or the \"named\" fallback, which uses the entry \"default\")" $config.name) }}
{{- end }}
{{- end }}
{{- $entry }}
{{- end }}

{{/*
"true" when the plugin may serve MIG devices or use the volume-mounts device list strategy with
these values: NVIDIA's chart grants CAP_SYS_ADMIN (and asks the container toolkit for the MIG
monitor devices) in those cases. Settings given as values win over the config files, as they do
in the plugin. Every entry counts, not only the default one (a config-manager may pick any entry
for a node). An existing ConfigMap (`config.name`) is read at install time with `lookup`; where it
cannot be read (helm template, GitOps renderers, a ConfigMap not created yet) it adds nothing:
`migCapabilities: true` then says that its entries use MIG.
*/}}
{{- define "nvidia-device-plugin.entryFlags" -}}
{{- $entry := include "nvidia-device-plugin.configEntry" . }}
{{- $flags := dict }}
{{- if and $entry .Values.config.map }}
{{- $content := index .Values.config.map $entry }}
{{- $file := kindIs "map" $content | ternary $content (fromYaml (toString $content)) }}
{{- $flags = $file.flags | default dict }}
{{- end }}
{{- toJson $flags }}
{{- end }}

{{- define "nvidia-device-plugin.configEntries" -}}
{{- $entries := dict }}
{{- if .Values.config.name }}
{{- $found := lookup "v1" "ConfigMap" (include "nvidia-device-plugin.namespace" .) .Values.config.name }}
{{- $entries = (($found | default dict).data) | default dict }}
{{- else if .Values.config.map }}
{{- $entries = .Values.config.map }}
{{- end }}
{{- $all := list }}
{{- range $name, $content := $entries }}
{{- $file := kindIs "map" $content | ternary $content (fromYaml (toString $content)) }}
{{- $all = append $all ($file.flags | default dict) }}
{{- end }}
{{- toJson $all }}
{{- end }}

{{- define "nvidia-device-plugin.mayUseMIG" -}}
{{- if kindIs "bool" .Values.migCapabilities }}
{{- .Values.migCapabilities }}
{{- else if kindIs "string" .Values.migStrategy }}
{{- ne .Values.migStrategy "none" }}
{{- else }}
{{- $uses := false }}
{{- range $flags := include "nvidia-device-plugin.configEntries" . | fromJsonArray }}
{{- if and (kindIs "string" $flags.migStrategy) (ne (toString $flags.migStrategy) "none") }}
{{- $uses = true }}
{{- end }}
{{- end }}
{{- $uses }}
{{- end }}
{{- end }}

{{- define "nvidia-device-plugin.mayUseVolumeMounts" -}}
{{- if kindIs "string" .Values.deviceListStrategy }}
{{- contains "volume-mounts" .Values.deviceListStrategy }}
{{- else }}
{{- $uses := false }}
{{- range $flags := include "nvidia-device-plugin.configEntries" . | fromJsonArray }}
{{- $plugin := $flags.plugin | default dict }}
{{- $strategy := $plugin.deviceListStrategy }}
{{- if kindIs "slice" $strategy }}
{{- if has "volume-mounts" $strategy }}
{{- $uses = true }}
{{- end }}
{{- else if kindIs "string" $strategy }}
{{- if contains "volume-mounts" $strategy }}
{{- $uses = true }}
{{- end }}
{{- end }}
{{- end }}
{{- $uses }}
{{- end }}
{{- end }}

{{- define "nvidia-device-plugin.securityContext" -}}
{{- if .Values.securityContext }}
{{- toYaml .Values.securityContext }}
{{- else if .Values.compatWithCPUManager }}
privileged: true
{{- else if or (eq (include "nvidia-device-plugin.mayUseMIG" .) "true") (eq (include "nvidia-device-plugin.mayUseVolumeMounts" .) "true") }}
capabilities:
  add: ["SYS_ADMIN"]
{{- else }}
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
{{- end }}
{{- end }}

{{/* "true" when a Prometheus Operator object may be rendered. */}}
{{- define "nvidia-device-plugin.monitoringAPI" -}}
{{- or .Values.metrics.forceMonitors (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}
{{- end }}
