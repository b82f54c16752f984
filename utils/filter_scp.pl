#!/usr/bin/env perl
# Prints the lines of a table whose f-th field (default: the first) is in an id list.
#
# Usage: filter_scp.pl [--exclude] [-f <field>] <id-list> [<in.scp>] > out.scp
#   <id-list>   only the first field of each of its lines matters
#   --exclude   print the lines whose field is NOT in the list
#   -f <field>  1-based field to filter on (default 1)
# Lines are printed unchanged and in input order.  Reads stdin without <in.scp>.
# A blank line in the id list, or an input line with fewer than <field> fields,
# is an error naming the file and line.
use strict;
use warnings;

my $exclude = 0;
my $field = 1;
while (@ARGV) {
    if ($ARGV[0] eq "--exclude") { $exclude = 1; shift @ARGV; next; }
    if ($ARGV[0] eq "-f") {
        shift @ARGV;
        $field = shift @ARGV;
        next;
    }
    last;
}

sub usage {
    die "Usage: filter_scp.pl [--exclude] [-f <field>] <id-list> [<in.scp>] > out.scp\n" .
        " Prints only the input lines whose <field>'th field (default: first) is in <id-list>;\n" .
        " only the first field of each line of <id-list> matters.  With --exclude, prints\n" .
        " only the lines that are NOT in <id-list>.\n";
}
usage() if @ARGV < 1 || @ARGV > 2;
defined $field && $field =~ /^[1-9][0-9]*$/
    or die "$0: -f needs a positive integer field number\n";

my $idlist = shift @ARGV;
my %seen;
open(my $ids, '<', $idlist) or die "$0: cannot open id list $idlist: $!\n";
while (my $line = <$ids>) {
    my @f = split(" ", $line);
    @f >= 1 or die "$0: $idlist:$.: empty line in id list\n";
    $seen{$f[0]} = 1;
}
close($ids);

my $in;
my $in_name = @ARGV ? $ARGV[0] : "stdin";
if (@ARGV) {
    open($in, '<', $ARGV[0]) or die "$0: cannot open $ARGV[0]: $!\n";
} else {
    $in = \*STDIN;
}
while (my $line = <$in>) {
    my $key;
    if ($field == 1) {
        $line =~ m/(\S+)/ or die "$0: $in_name:$.: empty line\n";
        $key = $1;
    } else {
        my @f = split(" ", $line);
        @f >= $field or die "$0: $in_name:$.: fewer than $field fields\n";
        $key = $f[$field - 1];
    }
    print $line if ($exclude xor exists $seen{$key});
}
