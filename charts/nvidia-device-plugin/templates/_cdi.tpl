{{/*
"true" when a CDI device-list strategy (cdi-annotations, cdi-cri) may be on: the plugin then
writes CDI specs to /var/run/cdi on the host and reads the driver's files under /driver-root.
Values win over the config file; an existing ConfigMap cannot be read at render time, so it
counts as "may".
*/}}
{{- define "nvidia-device-plugin.mayUseCDI" -}}
{{- if kindIs "string" .Values.deviceListStrategy }}
{{- contains "cdi-" .Values.deviceListStrategy }}
{{- else if .Values.config.name }}
{{- true }}
{{- else }}
{{- $flags := include "nvidia-device-plugin.entryFlags" . | fromJson }}
{{- $plugin := $flags.plugin | default dict }}
{{- $strategy := $plugin.deviceListStrategy }}
{{- if kindIs "slice" $strategy }}
{{- or (has "cdi-annotations" $strategy) (has "cdi-cri" $strategy) }}
{{- else if kindIs "string" $strategy }}
{{- contains "cdi-" $strategy }}
{{- else }}
{{- false }}
{{- end }}
{{- end }}
{{- end }}
