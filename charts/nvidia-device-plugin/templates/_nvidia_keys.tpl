{{/*
NVIDIA chart keys that span templates: the component selector label, GFD's timing settings (read
from gfd.* and from the top-level keys NVIDIA's GFD template reads), and NVIDIA's defaults of the
Node Feature Discovery subchart keys, which this chart accepts but does not deploy (validation.yml
fails the install when one is changed). tests/test_chart_nvidia_keys.py renders every key of
NVIDIA's values.yaml against them.
*/}}

{{/*
`app.kubernetes.io/component: <component>` for a DaemonSet's selector when
componentSelectorLabels.enabled and no selectorLabelsOverride (as NVIDIA's chart); call with
(dict "root" $ "component" NAME). Off by default: a DaemonSet's selector cannot change, so turning it
on recreates the DaemonSets.
*/}}
{{- define "nvidia-device-plugin.componentLabel" -}}
{{- if and ((.root.Values.componentSelectorLabels | default dict).enabled) (not .root.Values.selectorLabelsOverride) }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{/*
GFD's sleep interval and no-timestamp settings as JSON ({"sleepInterval": ..., "noTimestamp": ...},
null when unset): gfd.sleepInterval / gfd.noTimestamp, or NVIDIA's top-level sleepInterval /
noTimestamp. Both set to different values fails the render.
*/}}
{{- define "nvidia-device-plugin.gfdTiming" -}}
{{- $gfd := .Values.gfd | default dict }}
{{- $timing := dict }}
{{- range $key := list "sleepInterval" "noTimestamp" }}
{{- $nested := index $gfd $key }}
{{- $top := index $.Values $key }}
{{- if and (not (kindIs "invalid" $nested)) (not (kindIs "invalid" $top)) (ne (toString $nested) (toString $top)) }}
{{- fail (printf "%s: set to %v, and gfd.%s to %v: set one of them (both are GFD's %s)" $key $top $key $nested $key) }}
{{- end }}
{{- $_ := set $timing $key (kindIs "invalid" $nested | ternary $top $nested) }}
{{- end }}
{{- toJson $timing }}
{{- end }}

{{/* NVIDIA's defaults of the keys it passes to its Node Feature Discovery subchart. */}}
{{- define "nvidia-device-plugin.nvidiaNfdDefaults" -}}
nameOverride: node-feature-discovery
master:
  serviceAccount:
    name: node-feature-discovery
    create: true
  config:
    extraLabelNs: ["nvidia.com"]
worker:
  tolerations:
    - key: node-role.kubernetes.io/master
      operator: Equal
      value: ""
      effect: NoSchedule
    - key: nvidia.com/gpu
      operator: Equal
      value: present
      effect: NoSchedule
  config:
    sources:
      pci:
        deviceClassWhitelist: ["02", "03"]
        deviceLabelFields: [vendor]
{{- end }}

{{/*
The dotted path of the first leaf of "given" that differs from "default" ("" when none); call with
(dict "path" PATH "given" VALUE "default" VALUE).
*/}}
{{- define "nvidia-device-plugin.firstDifference" -}}
{{- if and (kindIs "map" .given) (kindIs "map" .default) }}
{{- $found := "" }}
{{- range $key := keys .given | sortAlpha }}
{{- if not $found }}
{{- $found = include "nvidia-device-plugin.firstDifference" (dict "path" (printf "%s.%s" $.path $key) "given" (index $.given $key) "default" (index $.default $key)) }}
{{- end }}
{{- end }}
{{- $found }}
{{- else if ne (toJson .given) (toJson .default) }}
{{- .path }}
{{- end }}
{{- end }}
