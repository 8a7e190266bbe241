{{/*
Render-time checks: values that pass the schema one by one but cannot work together fail
`helm install`/`helm template` with a message that says what to change.
*/}}

{{/* Bytes of a Kubernetes quantity ("60Gi", "64G", "1.5Ti", 8589934592), as a float. */}}
{{- define "lmcv.quantityBytes" -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $unit := trimPrefix $num $q -}}
{{- $mult := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- if not (hasKey $mult $unit) -}}
{{- fail (printf "cannot read %q as a byte quantity (e.g. 60Gi)" $q) -}}
{{- end -}}
{{- mulf (float64 $num) (get $mult $unit) -}}
{{- end -}}

{{/* Bytes of a Valkey size ("48gb" = 48 GiB, "48g" = 48e9, "512mb", "100"), as a float. */}}
{{- define "lmcv.valkeyBytes" -}}
{{- $s := lower (toString .) -}}
{{- $num := regexFind "^[0-9]+" $s -}}
{{- $unit := trimPrefix $num $s -}}
{{- $mult := dict "" 1.0 "b" 1.0 "k" 1e3 "kb" 1024.0 "m" 1e6 "mb" 1048576.0 "g" 1e9 "gb" 1073741824.0 -}}
{{- if not (hasKey $mult $unit) -}}
{{- fail (printf "cannot read %q as a Valkey size (e.g. 48gb)" $s) -}}
{{- end -}}
{{- mulf (float64 $num) (get $mult $unit) -}}
{{- end -}}

{{/* A byte count for messages: 48.0 GiB, 2.7 TiB. */}}
{{- define "lmcv.humanBytes" -}}
{{- $b := float64 . -}}
{{- if ge $b 1099511627776.0 -}}{{ printf "%.1f TiB" (divf $b 1099511627776.0) }}
{{- else if ge $b 1073741824.0 -}}{{ printf "%.1f GiB" (divf $b 1073741824.0) }}
{{- else -}}{{ printf "%.1f MiB" (divf $b 1048576.0) }}{{- end -}}
{{- end -}}

{{/* The module's server-side arena (arena_mb in valkey.module.args, default 1024), in bytes. */}}
{{- define "lmcv.moduleArenaBytes" -}}
{{- $mb := 1024.0 -}}
{{- $args := .Values.valkey.module.args -}}
{{- range $i, $a := $args -}}
{{- if and (eq (toString $a) "arena_mb") (lt (add1 $i) (len $args)) -}}
{{- $mb = float64 (index $args (add1 $i)) -}}
{{- end -}}
{{- end -}}
{{- mulf $mb 1048576.0 -}}
{{- end -}}

{{/* A byte count as the Kubernetes quantity to type, rounded up to whole Gi: 60Gi. */}}
{{- define "lmcv.giQuantity" -}}
{{- printf "%.0fGi" (ceil (divf (float64 .) 1073741824.0)) -}}
{{- end -}}

{{- define "lmcv.validate" -}}
{{- $v := .Values.valkey -}}
{{- $t := .Values.tierd -}}
{{- /* Valkey RAM: maxmemory (+ the module's arena) must fit the container's memory limit. */ -}}
{{- $limit := "" -}}
{{- with $v.resources.limits }}{{ $limit = .memory }}{{ end -}}
{{- if $limit -}}
{{- $limitBytes := include "lmcv.quantityBytes" $limit | float64 -}}
{{- $maxmem := include "lmcv.valkeyBytes" $v.maxmemory | float64 -}}
{{- $need := $maxmem -}}
{{- $arenaNote := "" -}}
{{- if $v.module.enabled -}}
{{- $arena := include "lmcv.moduleArenaBytes" . | float64 -}}
{{- $need = addf $maxmem $arena -}}
{{- $arenaNote = printf " plus the module's arena (%s)" (include "lmcv.humanBytes" $arena) -}}
{{- end -}}
{{- if gt $need $limitBytes -}}
{{- fail (printf "valkey.maxmemory %s (%s)%s does not fit valkey.resources.limits.memory %s (%s): Valkey would be OOM-killed instead of evicting. Raise the memory limit (and request) to about %s (25%% headroom for fragmentation, client and replication buffers) or lower valkey.maxmemory." (toString $v.maxmemory) (include "lmcv.humanBytes" $maxmem) $arenaNote (toString $limit) (include "lmcv.humanBytes" $limitBytes) (include "lmcv.giQuantity" (mulf $need 1.25))) -}}
{{- end -}}
{{- end -}}
{{- /* NVMe: tierd's budget must fit the volume the chart creates. */ -}}
{{- if and $t.enabled $t.nvme.enabled (has $t.nvme.volume.type (list "volumeClaimTemplate" "emptyDir")) $t.nvme.volume.size -}}
{{- $size := include "lmcv.quantityBytes" $t.nvme.volume.size | float64 -}}
{{- $budget := float64 $t.nvme.budgetBytes -}}
{{- if gt $budget $size -}}
{{- fail (printf "tierd.nvme.budgetBytes %.0f (%s) exceeds tierd.nvme.volume.size %s (%s): tierd would fill the volume and its writes would fail. Set tierd.nvme.volume.size to at least %s (budget + 10%%) or lower tierd.nvme.budgetBytes." $budget (include "lmcv.humanBytes" $budget) (toString $t.nvme.volume.size) (include "lmcv.humanBytes" $size) (include "lmcv.giQuantity" (mulf $budget 1.1))) -}}
{{- end -}}
{{- end -}}
{{- /* An existing claim is one volume: it can back one pod only. */ -}}
{{- if and $t.enabled $t.nvme.enabled (eq $t.nvme.volume.type "existingClaim") (gt (int (include "lmcv.replicas" .)) 1) -}}
{{- fail (printf "tierd.nvme.volume.type existingClaim serves one pod, but valkey.mode %s runs %s: use volumeClaimTemplate (a claim per pod)" $v.mode (include "lmcv.replicas" .)) -}}
{{- end -}}
{{- end -}}
